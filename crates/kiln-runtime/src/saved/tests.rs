//! Saved plans: round trips, loads on other backends, a typed error for each kind of damage,
//! and the loader fuzzer (`KILN_PLAN_FUZZ_CASES` raises its bounded case count).

use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar};
use kiln_device::{Buffer, Device, Error};
use serde_json::Value;

use super::format::{self, CONSTANTS_ALIGN, HEADER_BYTES};
use super::*;
use crate::ExecutionPlan;

fn cpu() -> Arc<Device> {
    kiln_cpu::open(&DeviceSpec::new("CPU", 0)).expect("the CPU device")
}

/// `name`'s device, or `None` after the skip line (a failure where `KILN_REQUIRE` names it).
fn other_device(backend: &str, spec: &str, test: &str) -> Option<Arc<Device>> {
    kiln_backends::register_all();
    match kiln_device::open_device(spec) {
        Ok(d) => Some(d),
        Err(e) => {
            kiln_device::testing::skip_unless_required(backend, test, &e);
            None
        }
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A batch of `rows` input rows for the sample model.
fn sample_x(rows: usize, inputs: usize) -> Vec<f32> {
    (0..rows * inputs).map(|i| ((i * 7) % 19) as f32 / 8.0 - 1.0).collect()
}

/// The sample model run in its original plan on `rows` rows: `y`'s bytes.
fn run_original(model: &mut SampleMlp, x: &[f32], rows: usize) -> Vec<u8> {
    let xb = &model.interface.inputs[0].buffer;
    xb.view(0, x.len()).unwrap().copy_from_slice(x).unwrap();
    model.plan.run(&[("batch", rows as i64)]).unwrap();
    let y = &model.interface.outputs[0].buffer;
    let mut out = vec![0u8; rows * model.shape.outputs * 4];
    y.view(0, rows * model.shape.outputs).unwrap().copyout(&mut out).unwrap();
    out
}

fn run_loaded(loaded: &mut LoadedPlan, x: &[f32], rows: usize, inputs: usize) -> HostTensor {
    let data = f32_bytes(x);
    let out = loaded.run(&[("x", TensorRef { dtype: Scalar::F32, shape: &[rows, inputs], data: &data })]).unwrap();
    assert_eq!(out.len(), 1);
    out.into_iter().next().unwrap()
}

fn sample_bytes(device: &Device) -> (SampleMlp, Vec<u8>) {
    let model = SampleMlp::record(device, MlpShape::default(), 4).unwrap();
    let bytes = SavedPlan::from_plan(&model.plan, &model.interface).unwrap().to_bytes().unwrap();
    (model, bytes)
}

// ------------------------------------------------------------------------------ round trips

#[test]
fn a_saved_plan_runs_to_the_same_bits_on_the_same_device() {
    let device = cpu();
    let mut model = SampleMlp::record(&device, MlpShape::default(), 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.kplan");
    let len = SavedPlan::save(&model.plan, &model.interface, &path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let inputs = model.shape.inputs;
    for (options, mapped) in
        [(LoadOptions::default(), true), (LoadOptions { map_constants: false, ..Default::default() }, false)]
    {
        let mut loaded = LoadedPlan::load_with(&path, &device, &options).unwrap();
        let weights: u64 = model.shape.weights().iter().map(|w| 4 * w.len() as u64).sum();
        assert!(loaded.stats().constant_bytes > weights, "the block holds the weights and a header");
        assert_eq!(loaded.stats().mapped_bytes, if mapped { weights } else { 0 });
        // Every batch size, including ones other than the recorded 4.
        for rows in [1, 3, 4, 8] {
            let x = sample_x(rows, inputs);
            let want = run_original(&mut model, &x, rows);
            let got = run_loaded(&mut loaded, &x, rows, inputs);
            assert_eq!(got.shape, vec![rows, model.shape.outputs]);
            assert_eq!(got.data, want, "{rows} rows, mapped {mapped}: the loaded plan's bits differ");
            let reference = model.shape.reference(&x);
            for (g, r) in f32s(&got.data).iter().zip(&reference) {
                assert!((g - r).abs() <= 1e-5 * r.abs().max(1.0), "{g} vs the host's {r}");
            }
        }
    }
    // The same from bytes in memory.
    let bytes = std::fs::read(&path).unwrap();
    let mut loaded = LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default()).unwrap();
    let x = sample_x(2, inputs);
    assert_eq!(run_loaded(&mut loaded, &x, 2, inputs).data, run_original(&mut model, &x, 2));
}

#[test]
fn a_loaded_plan_describes_its_inputs_outputs_and_variables() {
    let device = cpu();
    let (model, bytes) = sample_bytes(&device);
    let loaded = LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default()).unwrap();
    let x: Vec<&TensorSpec> = loaded.inputs().collect();
    assert_eq!(x.len(), 1);
    assert_eq!((x[0].name.as_str(), x[0].dtype), ("x", Scalar::F32));
    assert_eq!(x[0].shape, vec![Dim::from("batch"), Dim::Fixed(16)]);
    assert_eq!(x[0].shape_text(), "[batch, 16]");
    let y: Vec<&TensorSpec> = loaded.outputs().collect();
    assert_eq!(y[0].shape, vec![Dim::from("batch"), Dim::Fixed(8)]);
    assert_eq!(
        loaded.variables(),
        [PlanVariable { name: "batch".into(), value: 4, min: 1, max: model.shape.max_batch as i64 }]
    );
    assert_eq!((loaded.stats().kernels, loaded.stats().nodes), (4, 4));
    assert_eq!(loaded.input_buffer("x").map(Buffer::len), Some(8 * 16));
    assert!(loaded.output_buffer("x").is_none());
}

#[test]
fn buffers_get_their_roles_from_the_recorded_order() {
    let device = cpu();
    let (_, bytes) = sample_bytes(&device);
    let parts = Parts::split(&bytes);
    let roles: Vec<(String, bool)> = parts.manifest["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["role"].as_str().unwrap().to_string(), b["tensor"].is_string()))
        .collect();
    // x, y, then in order of use: W1, h, b1, a, W2, o, b2.
    let want = [
        ("input", false),
        ("output", false),
        ("constant", true),
        ("scratch", false),
        ("constant", true),
        ("scratch", false),
        ("constant", true),
        ("scratch", false),
        ("constant", true),
    ];
    assert_eq!(roles, want.map(|(r, t)| (r.to_string(), t)));
    // The file's parts where the format puts them.
    let c = &parts.manifest["constants"];
    assert_eq!(c["offset"].as_u64().unwrap() % CONSTANTS_ALIGN, 0);
    assert_eq!(c["offset"].as_u64().unwrap() + c["bytes"].as_u64().unwrap(), bytes.len() as u64);
    let names: Vec<&str> =
        parts.manifest["kernels"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mlp_matmul1", "mlp_bias_relu", "mlp_matmul2", "mlp_bias"]);
    // The constants block is a safetensors file any reader takes.
    let st = safetensors::SafeTensors::deserialize(&parts.constants).unwrap();
    assert_eq!(st.len(), 4);
    assert_eq!(st.tensor("buffer2").unwrap().shape(), [16 * 32]);
}

/// State a plan reads before writing it is saved with the values it had, and the loaded
/// plan's updates go to private pages: the file does not change.
#[test]
fn state_a_plan_updates_is_saved_and_never_written_back_to_the_file() {
    let device = cpu();
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 64);
    let (s, x) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
    let i = k.global(0, &n);
    k.store(&s.at(&i), &(s.at(&i).load() + x.at(&i).load()));
    let accumulate = device.compile(&k.finish().unwrap(), Some("accumulate")).unwrap();
    let state = Buffer::from_slice(device.allocator(), &[10.0f32; 64]).unwrap();
    let x = device.buffer(Scalar::F32, 64).unwrap();
    let mut plan = ExecutionPlan::new(&device).unwrap();
    plan.exec(&accumulate, &[&state, &x], &[("n", 64)]).unwrap();
    let io = PlanInterface { inputs: vec![PlanTensor::new("x", &x)], outputs: vec![PlanTensor::new("s", &state)] };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.kplan");
    SavedPlan::save(&plan, &io, &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mut loaded = LoadedPlan::load(&path, &device).unwrap();
    let ones = f32_bytes(&[1.0; 64]);
    for round in 1..=3 {
        let out = loaded.run(&[("x", TensorRef { dtype: Scalar::F32, shape: &[64], data: &ones })]).unwrap();
        assert_eq!(f32s(&out[0].data), vec![10.0 + round as f32; 64]);
    }
    drop(loaded);
    assert_eq!(std::fs::read(&path).unwrap(), before, "the plan file changed");
}

/// Copies, windows at offsets in one allocation and a window of another dtype round-trip.
#[test]
fn copies_and_windows_of_one_allocation_round_trip() {
    let device = cpu();
    let mut k = KernelBuilder::new();
    let (x, y) = (k.param(0, Scalar::F32, 8), k.param(1, Scalar::F32, 8));
    let i = k.global(0, 8);
    k.store(&y.at(&i), &(x.at(&i).load() * 3.0f32));
    let triple = device.compile(&k.finish().unwrap(), Some("triple")).unwrap();
    let pool = device.buffer(Scalar::F32, 64).unwrap();
    let (a, b, c) = (pool.view(0, 8).unwrap(), pool.view(16, 8).unwrap(), pool.view(40, 8).unwrap());
    let input = device.buffer(Scalar::F32, 8).unwrap();
    let weights = Buffer::from_slice(device.allocator(), &[7u32; 8]).unwrap().reinterpret(Scalar::F32).unwrap();
    let out = device.buffer(Scalar::F32, 16).unwrap();
    let mut plan = ExecutionPlan::new(&device).unwrap();
    plan.copy(&a, &input).unwrap(); // a = input
    plan.exec(&triple, &[&a, &b], &[]).unwrap(); // b = 3a
    plan.exec(&triple, &[&weights, &c], &[]).unwrap(); // c = 3w
    plan.copy(&out.view(0, 8).unwrap(), &b).unwrap();
    plan.copy(&out.view(8, 8).unwrap(), &c).unwrap();
    let io = PlanInterface { inputs: vec![PlanTensor::new("in", &input)], outputs: vec![PlanTensor::new("out", &out)] };
    let bytes = SavedPlan::from_plan(&plan, &io).unwrap().to_bytes().unwrap();
    let parts = Parts::split(&bytes);
    assert_eq!(parts.manifest["kernels"].as_array().unwrap().len(), 1, "one kernel launched twice is saved once");
    let mut loaded = LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default()).unwrap();
    let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let got = loaded.run(&[("in", TensorRef { dtype: Scalar::F32, shape: &[8], data: &data })]).unwrap();
    let w = f32::from_bits(7) * 3.0;
    let want: Vec<f32> = [3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0].into_iter().chain([w; 8]).collect();
    assert_eq!(f32s(&got[0].data), want);
}

#[test]
fn collectives_and_foreign_buffers_are_refused_when_saving() {
    let device = cpu();
    let ends = kiln_device::LocalChannel::world(1).unwrap();
    let channel: Arc<dyn kiln_device::Channel> = ends[0].clone();
    let b = device.buffer(Scalar::F32, 4).unwrap();
    let mut plan = ExecutionPlan::new(&device).unwrap();
    plan.all_reduce(&channel, &b, &b, kiln_device::ReduceOp::Sum).unwrap();
    let e = SavedPlan::from_plan(&plan, &PlanInterface::default()).unwrap_err();
    assert!(matches!(&e, PlanFileError::Unsaveable(m) if m.contains("collective")), "{e}");

    let plan = ExecutionPlan::new(&device).unwrap();
    let bad_shape =
        PlanInterface { inputs: vec![PlanTensor::new("x", &b).with_shape([Dim::from("n")])], ..Default::default() };
    let e = SavedPlan::from_plan(&plan, &bad_shape).unwrap_err();
    assert!(matches!(&e, PlanFileError::Unsaveable(m) if m.contains("`n`")), "{e}");
    let too_big =
        PlanInterface { inputs: vec![PlanTensor::new("x", &b).with_shape([Dim::Fixed(5)])], ..Default::default() };
    assert!(matches!(SavedPlan::from_plan(&plan, &too_big), Err(PlanFileError::Unsaveable(_))));
    let twice =
        PlanInterface { inputs: vec![PlanTensor::new("x", &b), PlanTensor::new("x", &b)], ..Default::default() };
    assert!(matches!(SavedPlan::from_plan(&plan, &twice), Err(PlanFileError::Unsaveable(_))));
}

// ------------------------------------------------------------------------------ other devices

fn loads_on(backend: &str, spec: &str, test: &str) {
    let Some(other) = other_device(backend, spec, test) else { return };
    let device = cpu();
    let (mut model, bytes) = sample_bytes(&device);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.kplan");
    std::fs::write(&path, &bytes).unwrap();
    let mut loaded = LoadedPlan::load(&path, &other).unwrap();
    assert_eq!(loaded.device(), other.spec());
    assert_eq!(loaded.stats().mapped_bytes, 0, "{spec}'s memory is not host memory: constants are copied");
    let inputs = model.shape.inputs;
    for rows in [1, 5, 8] {
        let x = sample_x(rows, inputs);
        let want = f32s(&run_original(&mut model, &x, rows));
        let got = f32s(&run_loaded(&mut loaded, &x, rows, inputs).data);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{spec}, {rows} rows: {g} vs the CPU's {w}");
        }
    }
}

#[test]
fn a_plan_saved_on_the_cpu_loads_on_opencl() {
    loads_on("opencl", "OPENCL:0", "a_plan_saved_on_the_cpu_loads_on_opencl");
}

#[test]
fn a_plan_saved_on_the_cpu_loads_on_webgpu() {
    loads_on("webgpu", "WEBGPU:0", "a_plan_saved_on_the_cpu_loads_on_webgpu");
}

#[test]
fn a_kernel_a_device_cannot_render_is_named_with_what_it_lacks() {
    let test = "a_kernel_a_device_cannot_render_is_named_with_what_it_lacks";
    let Some(webgpu) = other_device("webgpu", "WEBGPU:0", test) else { return };
    let device = cpu();
    let mut k = KernelBuilder::new();
    let (x, y) = (k.param(0, Scalar::F64, 4), k.param(1, Scalar::F64, 4));
    let i = k.global(0, 4);
    k.store(&y.at(&i), &(x.at(&i).load() * 2.0f64));
    let double = device.compile(&k.finish().unwrap(), Some("double_f64")).unwrap();
    let (a, b) = (device.buffer(Scalar::F64, 4).unwrap(), device.buffer(Scalar::F64, 4).unwrap());
    let mut plan = ExecutionPlan::new(&device).unwrap();
    plan.exec(&double, &[&a, &b], &[]).unwrap();
    let io = PlanInterface { inputs: vec![PlanTensor::new("a", &a)], outputs: vec![PlanTensor::new("b", &b)] };
    let bytes = SavedPlan::from_plan(&plan, &io).unwrap().to_bytes().unwrap();
    let e = LoadedPlan::from_bytes(&bytes, &webgpu, &LoadOptions::default()).unwrap_err();
    match &e {
        PlanFileError::Unsupported { kernel, device, feature } => {
            assert_eq!(kernel, "double_f64");
            assert_eq!(device, &webgpu.spec().to_string());
            assert!(feature.contains("f64"), "{feature}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // The CPU has f64: the same bytes load there.
    LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default()).unwrap();
}

// ------------------------------------------------------------------------------ damage

/// A plan file split into its parts, to damage one and seal it again.
struct Parts {
    manifest: Value,
    kernels: Vec<u8>,
    constants: Vec<u8>,
}

impl Parts {
    fn split(bytes: &[u8]) -> Parts {
        let len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
        let manifest: Value = serde_json::from_slice(&bytes[HEADER_BYTES..HEADER_BYTES + len]).unwrap();
        let at = |s: &str, f: &str| manifest[s][f].as_u64().unwrap() as usize;
        let kernels = bytes[at("kernel_section", "offset")..][..at("kernel_section", "bytes")].to_vec();
        let constants = bytes[at("constants", "offset")..][..at("constants", "bytes")].to_vec();
        Parts { manifest, kernels, constants }
    }

    /// The file again, with every checksum recomputed, and the sections placed where the
    /// format puts them unless `keep_offsets`.
    fn seal(&self, keep_offsets: bool) -> Vec<u8> {
        let mut m = self.manifest.clone();
        for k in m["kernels"].as_array_mut().into_iter().flatten() {
            let (o, n) = (k["offset"].as_u64().unwrap_or(0) as usize, k["bytes"].as_u64().unwrap_or(0) as usize);
            if let Some(text) = o.checked_add(n).and_then(|end| self.kernels.get(o..end)) {
                k["checksum"] = Value::from(format::checksum(text));
            }
        }
        if m["constants"].is_object() {
            m["constants"]["checksum"] = Value::from(format::checksum(&self.constants));
        }
        let mut json = serde_json::to_vec(&m).unwrap();
        if !keep_offsets {
            for _ in 0..8 {
                let at = HEADER_BYTES as u64 + json.len() as u64;
                m["kernel_section"]["offset"] = Value::from(at);
                m["kernel_section"]["bytes"] = Value::from(self.kernels.len() as u64);
                let end = at + self.kernels.len() as u64;
                let c = if self.constants.is_empty() { end } else { end.next_multiple_of(CONSTANTS_ALIGN) };
                m["constants"]["offset"] = Value::from(c);
                m["constants"]["bytes"] = Value::from(self.constants.len() as u64);
                json = serde_json::to_vec(&m).unwrap();
            }
        }
        let mut out = format::header(&json).to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&self.kernels);
        let c = m["constants"]["offset"].as_u64().unwrap_or(0) as usize;
        if !self.constants.is_empty() && c >= out.len() && c - out.len() < 1 << 20 {
            out.resize(c, 0);
        }
        out.extend_from_slice(&self.constants);
        out
    }
}

fn load_err(bytes: &[u8]) -> PlanFileError {
    LoadedPlan::from_bytes(bytes, &cpu(), &LoadOptions::default()).expect_err("a damaged plan loaded")
}

#[test]
fn sealing_the_parts_again_gives_a_file_that_loads() {
    let device = cpu();
    let (_, bytes) = sample_bytes(&device);
    let (parts, sealed) = (Parts::split(&bytes), Parts::split(&bytes).seal(false));
    let again = Parts::split(&sealed);
    assert_eq!(again.manifest["nodes"], parts.manifest["nodes"]);
    assert!(again.kernels == parts.kernels && again.constants == parts.constants);
    LoadedPlan::from_bytes(&sealed, &device, &LoadOptions::default()).unwrap();
}

#[test]
fn a_truncated_file_is_a_truncated_error_wherever_it_is_cut() {
    let (_, bytes) = sample_bytes(&cpu());
    let parts = Parts::split(&bytes);
    let kernels_at = parts.manifest["kernel_section"]["offset"].as_u64().unwrap() as usize;
    let constants_at = parts.manifest["constants"]["offset"].as_u64().unwrap() as usize;
    for cut in [3, 10, 40, 64, 100, kernels_at - 1, kernels_at + 10, constants_at, bytes.len() - 1] {
        match load_err(&bytes[..cut]) {
            PlanFileError::Truncated { needed, len, .. } => assert!(len == cut as u64 && needed > len),
            e => panic!("cut at {cut}: {e:?}"),
        }
    }
    assert!(matches!(load_err(&[]), PlanFileError::Truncated { .. }));
}

#[test]
fn a_flipped_bit_is_a_checksum_error_naming_the_part() {
    let (_, bytes) = sample_bytes(&cpu());
    let parts = Parts::split(&bytes);
    let at = |s: &str| parts.manifest[s]["offset"].as_u64().unwrap() as usize;
    let cases = [
        (HEADER_BYTES + 5, "manifest"),
        (at("kernel_section") + 20, "kernel `mlp_matmul1`"),
        (at("constants") + 3, "constants"), // the safetensors header
        (bytes.len() - 5, "constants"),     // a weight
        (30, "manifest"),                   // the manifest's checksum itself
    ];
    for (byte, part) in cases {
        let mut damaged = bytes.clone();
        damaged[byte] ^= 0x10;
        match load_err(&damaged) {
            PlanFileError::Checksum { part: p, recorded, computed } => {
                assert_eq!(p, part, "byte {byte}");
                assert_ne!(recorded, computed);
            }
            e => panic!("byte {byte}: {e:?}"),
        }
    }
}

#[test]
fn the_header_is_checked_before_anything_else() {
    let (_, bytes) = sample_bytes(&cpu());
    let mut other = bytes.clone();
    other[0] = b'X';
    assert!(matches!(load_err(&other), PlanFileError::NotAPlan { found } if found.contains("XILNPLAN")));
    assert!(matches!(load_err(b"PK\x03\x04 a zip file"), PlanFileError::NotAPlan { .. }));
    let mut future = bytes.clone();
    future[8..12].copy_from_slice(&2u32.to_le_bytes());
    let e = load_err(&future);
    assert!(matches!(e, PlanFileError::UnknownVersion { found: 2, known: 1 }), "{e:?}");
    assert!(e.to_string().contains("version 2"), "{e}");
    // A future version is refused by name even when the rest is cut.
    assert!(matches!(load_err(&future[..12]), PlanFileError::UnknownVersion { found: 2, .. }));
    let mut reserved = bytes.clone();
    reserved[50] = 1;
    assert!(matches!(load_err(&reserved), PlanFileError::Malformed(m) if m.contains("reserved")));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(load_err(&longer), PlanFileError::Malformed(m) if m.contains("after its last part")));
}

/// Edits of the manifest that keep every checksum right: each is refused by the structure
/// checks or the launch checks, with a typed error, before anything runs.
#[test]
fn a_sealed_manifest_that_does_not_describe_a_plan_is_refused() {
    let (_, bytes) = sample_bytes(&cpu());
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut parts = Parts::split(&bytes);
        f(&mut parts.manifest);
        load_err(&parts.seal(false))
    };
    let node = |v: &mut Value, n: usize| v["nodes"][n]["exec"].clone();
    // Sizes that overflow.
    let e = edit(&|m| m["nodes"][0]["exec"]["args"][0]["len"] = Value::from(u64::MAX));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("outside buffer")), "{e}");
    let e = edit(&|m| m["buffers"][3]["bytes"] = Value::from(u64::MAX));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("larger than any buffer")), "{e}");
    let e = edit(&|m| m["nodes"][0]["exec"]["args"][1]["offset"] = Value::from(u64::MAX - 3));
    assert!(matches!(&e, PlanFileError::Malformed(_)), "{e}");
    // Indices out of range.
    let e = edit(&|m| m["nodes"][1]["exec"]["kernel"] = Value::from(99));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("kernel 99")), "{e}");
    let e = edit(&|m| m["inputs"][0]["view"]["buffer"] = Value::from(1000));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("buffer 1000")), "{e}");
    // Mismatched slots: a launch missing a buffer, buffers swapped (dtype and size), a weight
    // window too short for the kernel.
    let e = edit(&|m| {
        let _ = m["nodes"][0]["exec"]["args"].as_array_mut().unwrap().pop();
    });
    assert!(matches!(&e, PlanFileError::Node { node: 0, source: Error::Launch(_), .. }), "{e}");
    let e = edit(&|m| {
        let n = node(m, 2);
        m["nodes"][0]["exec"]["args"] = n["args"].clone();
    });
    assert!(matches!(&e, PlanFileError::Node { node: 0, .. }), "{e}");
    let e = edit(&|m| m["nodes"][0]["exec"]["args"][1]["len"] = Value::from(100));
    assert!(
        matches!(&e, PlanFileError::Node { node: 0, source: Error::Launch(s), .. } if s.contains("elements")),
        "{e}"
    );
    let e = edit(&|m| m["nodes"][0]["exec"]["args"][1]["dtype"] = Value::from("i32"));
    assert!(matches!(&e, PlanFileError::Node { node: 0, source: Error::Launch(s), .. } if s.contains("i32")), "{e}");
    // A window that is not aligned for its dtype.
    let e = edit(&|m| {
        m["nodes"][0]["exec"]["args"][1]["offset"] = Value::from(2);
        m["nodes"][0]["exec"]["args"][1]["len"] = Value::from(4);
    });
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("multiple")), "{e}");
    // Variables: an unknown one in a shape, a value outside the kernels' range, one missing.
    let e = edit(&|m| m["inputs"][0]["shape"][0] = Value::from("rows"));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("`rows`")), "{e}");
    let e = edit(&|m| m["variables"][0]["value"] = Value::from(9));
    assert!(matches!(&e, PlanFileError::Node { source: Error::Ir(_), .. }), "{e}");
    let e = edit(&|m| m["variables"] = Value::Array(Vec::new()));
    assert!(matches!(&e, PlanFileError::Malformed(_)), "{e}");
    // A constant that does not match its buffer, or is missing.
    let e = edit(&|m| m["buffers"][2]["tensor"] = Value::from("buffer4"));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("bytes")), "{e}");
    let e = edit(&|m| m["buffers"][3]["tensor"] = Value::from("nothing"));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("`nothing`")), "{e}");
    // Unknown fields and wrong types.
    let e = edit(&|m| m["extra"] = Value::from(1));
    assert!(matches!(&e, PlanFileError::Malformed(s) if s.contains("extra")), "{e}");
    let e = edit(&|m| m["nodes"][0] = Value::from("exec"));
    assert!(matches!(&e, PlanFileError::Malformed(_)), "{e}");
    // Sections out of place.
    let mut parts = Parts::split(&bytes);
    parts.manifest["constants"]["offset"] = Value::from(4097);
    assert!(matches!(load_err(&parts.seal(true)), PlanFileError::Malformed(_) | PlanFileError::Truncated { .. }));
}

#[test]
fn a_kernel_that_does_not_parse_or_validate_is_a_kernel_error() {
    let (_, bytes) = sample_bytes(&cpu());
    let mut parts = Parts::split(&bytes);
    let text = String::from_utf8(parts.kernels.clone()).unwrap();
    let broken = text.replacen("SINK", "SIMK", 1);
    parts.kernels = broken.into_bytes();
    match load_err(&parts.seal(false)) {
        PlanFileError::Kernel { kernel, source: Error::Ir(_) } => assert_eq!(kernel, "mlp_matmul1"),
        e => panic!("{e:?}"),
    }
}

/// A kernel whose load reads one element past its buffer: refused at load under strict bounds;
/// otherwise loaded guarded, and its run fails with `OutOfBounds`, the access skipped.
#[test]
fn a_kernel_that_reads_past_its_buffer_never_leaves_it() {
    let device = cpu();
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 64);
    let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
    let i = k.global(0, &n);
    k.store(&y.at(&i), &x.at(&(&i + 1)).load());
    let shift = device.compile(&k.finish().unwrap(), Some("shift")).unwrap();
    let (a, b) = (device.buffer(Scalar::F32, 8).unwrap(), device.buffer(Scalar::F32, 8).unwrap());
    let mut plan = ExecutionPlan::new(&device).unwrap();
    plan.exec(&shift, &[&a, &b], &[("n", 8)]).unwrap();
    let io = PlanInterface { inputs: vec![PlanTensor::new("a", &a)], outputs: vec![PlanTensor::new("b", &b)] };
    let bytes = SavedPlan::from_plan(&plan, &io).unwrap().to_bytes().unwrap();

    let strict = LoadOptions { strict_bounds: true, ..Default::default() };
    match LoadedPlan::from_bytes(&bytes, &device, &strict).unwrap_err() {
        PlanFileError::Node { node: 0, what, source: Error::OutOfBounds { access, .. } } => {
            assert_eq!(what, "shift");
            assert!(access.last >= access.len, "{access:?}");
        }
        e => panic!("{e:?}"),
    }
    let mut loaded = LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default()).unwrap();
    let data = f32_bytes(&[1.0; 8]);
    match loaded.run(&[("a", TensorRef { dtype: Scalar::F32, shape: &[8], data: &data })]).unwrap_err() {
        PlanFileError::Device(Error::OutOfBounds { access, .. }) => assert!(access.guarded && access.first == 8),
        e => panic!("{e:?}"),
    }
}

// ------------------------------------------------------------------------------ inputs

#[test]
fn a_wrong_input_is_an_error_naming_it_and_what_it_expects() {
    let device = cpu();
    let (_, bytes) = sample_bytes(&device);
    let mut loaded = LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default()).unwrap();
    let data = f32_bytes(&sample_x(2, 16));
    let x = |shape: &'static [usize]| TensorRef { dtype: Scalar::F32, shape, data: &data };
    let err = |loaded: &mut LoadedPlan, inputs: &[(&str, TensorRef<'_>)]| match loaded.run(inputs).unwrap_err() {
        PlanFileError::Input { name, message } => (name, message),
        e => panic!("{e:?}"),
    };
    let (name, m) = err(&mut loaded, &[("z", x(&[2, 16]))]);
    assert!(name == "z" && m.contains("x f32 [batch, 16]"), "{m}");
    let (name, m) = err(&mut loaded, &[]);
    assert!(name == "x" && m.contains("missing"), "{m}");
    let (_, m) = err(&mut loaded, &[("x", TensorRef { dtype: Scalar::I32, ..x(&[2, 16]) })]);
    assert!(m.contains("got i32") && m.contains("f32 [batch, 16]"), "{m}");
    let (_, m) = err(&mut loaded, &[("x", x(&[4, 8]))]);
    assert!(m.contains("dimension 1 is 8"), "{m}");
    let (_, m) = err(&mut loaded, &[("x", x(&[32]))]);
    assert!(m.contains("1 dimensions"), "{m}");
    let (_, m) = err(&mut loaded, &[("x", x(&[3, 16]))]);
    assert!(m.contains("needs 192 bytes, got 128"), "{m}");
    let big = f32_bytes(&sample_x(9, 16));
    let (_, m) = err(&mut loaded, &[("x", TensorRef { dtype: Scalar::F32, shape: &[9, 16], data: &big })]);
    assert!(m.contains("batch in [1, 8]"), "{m}");
    let (_, m) = err(&mut loaded, &[("x", x(&[2, 16])), ("x", x(&[2, 16]))]);
    assert!(m.contains("more than once"), "{m}");
    // A variable given that contradicts the input's shape.
    let e = loaded.run_with(&[("x", x(&[2, 16]))], &[("batch", 3)]).unwrap_err();
    assert!(matches!(e, PlanFileError::Input { .. }), "{e}");
    // The plan still runs after all of these.
    assert_eq!(loaded.run(&[("x", x(&[2, 16]))]).unwrap()[0].shape, [2, 8]);
}

// ------------------------------------------------------------------------------ the fuzzer

/// splitmix64: a small deterministic generator for the fuzzer's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Every number and string of the manifest, as JSON pointers.
fn leaves(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| leaves(v, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| leaves(v, format!("{at}/{i}"), out)),
        _ => out.push(at),
    }
}

/// A value to put in a manifest field: around the interesting edges of each kind.
fn interesting(rng: &mut Rng, old: &Value) -> Value {
    let numbers: [i128; 14] = [0, 1, 2, 3, 7, 8, 9, 63, 64, 4096, -1, i64::MAX as i128, u64::MAX as i128, 1 << 40];
    match rng.below(6) {
        0 => Value::from(["f32", "i32", "u8", "f64", "bool", "f16", "x", ""][rng.below(8)]),
        1 => {
            Value::from(["batch", "n", "buffer0", "buffer2", "mlp_bias", "input", "scratch", "constant"][rng.below(8)])
        }
        2 => Value::Null,
        _ => match (old.as_i64(), numbers[rng.below(numbers.len())]) {
            (Some(o), _) if rng.below(3) == 0 => Value::from(o.wrapping_add(rng.below(5) as i64 - 2)),
            (_, n) if n < 0 => Value::from(n as i64),
            (_, n) => Value::from(n as u64),
        },
    }
}

/// One mutation of a valid plan file, and what it was.
fn mutate(rng: &mut Rng, bytes: &[u8]) -> (Vec<u8>, String) {
    let parts = Parts::split(bytes);
    match rng.below(6) {
        0 => {
            let cut = rng.below(bytes.len());
            (bytes[..cut].to_vec(), format!("cut at {cut}"))
        }
        1 => {
            let mut b = bytes.to_vec();
            let flips: Vec<usize> = (0..1 + rng.below(8)).map(|_| rng.below(b.len() * 8)).collect();
            for &f in &flips {
                b[f / 8] ^= 1 << (f % 8);
            }
            (b, format!("bits {flips:?} flipped"))
        }
        2 | 3 => {
            // Manifest fields edited, checksums sealed again.
            let mut p = parts;
            let mut paths = Vec::new();
            leaves(&p.manifest, String::new(), &mut paths);
            let mut what = Vec::new();
            for _ in 0..1 + rng.below(3) {
                let path = &paths[rng.below(paths.len())];
                let Some(slot) = p.manifest.pointer_mut(path) else { continue };
                let new = interesting(rng, slot);
                what.push(format!("{path} = {new}"));
                *slot = new;
            }
            let keep = rng.below(4) == 0;
            (p.seal(keep), format!("manifest {what:?} (offsets kept: {keep})"))
        }
        4 => {
            // Kernel text edited (a number or a name changed), checksums sealed again.
            let mut p = parts;
            let mut text = String::from_utf8(p.kernels.clone()).unwrap();
            let digits: Vec<usize> = text.char_indices().filter(|(_, c)| c.is_ascii_digit()).map(|(i, _)| i).collect();
            let at = digits[rng.below(digits.len())];
            let new = ["0", "1", "9", "99", "-1", "4096", "2147483647"][rng.below(7)];
            text.replace_range(at..at + 1, new);
            let growth = new.len() as u64 - 1;
            // The kernel holding `at` grows; the ones after it move.
            for k in p.manifest["kernels"].as_array_mut().unwrap() {
                let (o, n) = (k["offset"].as_u64().unwrap(), k["bytes"].as_u64().unwrap());
                if (at as u64) < o {
                    k["offset"] = Value::from(o + growth);
                } else if (at as u64) < o + n {
                    k["bytes"] = Value::from(n + growth);
                }
            }
            p.kernels = text.into_bytes();
            (p.seal(false), format!("kernel text byte {at} = {new}"))
        }
        _ => {
            // Weight bytes changed, checksums sealed again: the plan loads and computes garbage.
            let mut p = parts;
            let at = p.constants.len() - 1 - rng.below(64);
            p.constants[at] ^= 0xff;
            (p.seal(false), format!("constant byte {at} changed"))
        }
    }
}

/// The loader fuzzer: mutations of a valid plan (truncation, bit flips, manifest field edits,
/// kernel text edits, weight edits) never panic or crash; each is refused with a typed error or
/// loads, and a plan that loads runs through the safe launch path (its result, or a typed
/// error such as a guard that fired). A quarter of the cases load from a file, with the
/// constants mapped in place. `KILN_PLAN_FUZZ_CASES` sets the case count (default 200);
/// `KILN_PLAN_FUZZ_SEED` the first seed.
#[test]
fn fuzz_the_loader() {
    let cases: u64 = std::env::var("KILN_PLAN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let seed: u64 = std::env::var("KILN_PLAN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let device = cpu();
    let (_, bytes) = sample_bytes(&device);
    let dir = tempfile::tempdir().unwrap();
    let (mut loaded_count, mut refused) = (0, std::collections::BTreeMap::<&str, usize>::new());
    for case in seed..seed + cases {
        let mut rng = Rng(case);
        let (damaged, what) = mutate(&mut rng, &bytes);
        // A file of its own per case (removed after it): a mapping never outlives its plan, and
        // a file one saw is never rewritten either.
        let file = dir.path().join(format!("case{case}.kplan"));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Every fourth case from a file, its constants mapped in place; the others from bytes.
            let loaded = if case % 4 == 0 {
                std::fs::write(&file, &damaged).map_err(|e| PlanFileError::Io {
                    action: "write",
                    path: file.clone(),
                    source: e,
                })?;
                LoadedPlan::load(&file, &device)
            } else {
                LoadedPlan::from_bytes(&damaged, &device, &LoadOptions::default())
            };
            match loaded {
                Err(e) => Err(e),
                Ok(mut plan) => {
                    // Inputs as the loaded plan describes them, at the saved variable values.
                    let inputs: Vec<(String, Scalar, Vec<usize>)> = plan
                        .inputs()
                        .map(|t| {
                            let shape = t
                                .shape
                                .iter()
                                .map(|d| match d {
                                    Dim::Fixed(n) => (*n).min(1 << 16) as usize,
                                    Dim::Var(v) => plan
                                        .variables()
                                        .iter()
                                        .find(|p| &p.name == v)
                                        .map_or(1, |p| p.value.clamp(0, 1 << 16) as usize),
                                })
                                .collect();
                            (t.name.clone(), t.dtype, shape)
                        })
                        .collect();
                    let data: Vec<Vec<u8>> = inputs
                        .iter()
                        .map(|(_, d, s)| vec![0x3f; s.iter().product::<usize>().min(1 << 20) * d.size()])
                        .collect();
                    let refs: Vec<(&str, TensorRef<'_>)> = inputs
                        .iter()
                        .zip(&data)
                        .map(|((n, d, s), b)| (n.as_str(), TensorRef { dtype: *d, shape: s, data: b }))
                        .collect();
                    let _ = plan.run(&refs);
                    Ok(())
                }
            }
        }));
        match outcome {
            Err(_) => {
                panic!("case {case} ({what}) panicked; rerun with KILN_PLAN_FUZZ_SEED={case} KILN_PLAN_FUZZ_CASES=1")
            }
            Ok(Ok(())) => loaded_count += 1,
            Ok(Err(e)) => {
                let kind = match e {
                    PlanFileError::Truncated { .. } => "truncated",
                    PlanFileError::Checksum { .. } => "checksum",
                    PlanFileError::NotAPlan { .. } => "not a plan",
                    PlanFileError::UnknownVersion { .. } => "version",
                    PlanFileError::Malformed(_) => "malformed",
                    PlanFileError::Kernel { .. } => "kernel",
                    PlanFileError::Node { .. } => "node",
                    PlanFileError::Unsupported { .. } => "unsupported",
                    PlanFileError::Device(_) => "device",
                    PlanFileError::Io { .. } | PlanFileError::Unsaveable(_) | PlanFileError::Input { .. } => {
                        panic!("case {case} ({what}): an error loading a file cannot give: {e}")
                    }
                };
                *refused.entry(kind).or_default() += 1;
            }
        }
    }
    eprintln!("fuzz_the_loader: {cases} cases from seed {seed}: {loaded_count} loaded and ran, refused: {refused:?}");
    if cases >= 100 {
        // The mutations reach past the checksums: structure, kernels and launches are refused too.
        for kind in ["truncated", "checksum", "malformed"] {
            assert!(refused.contains_key(kind), "no case was refused as {kind}: {refused:?}");
        }
        assert!(loaded_count > 0, "no mutated plan loaded: the fuzzer never reached a run");
    }
}

/// The Python binding holds these in objects Python may move between threads.
#[test]
fn saved_and_loaded_plans_may_move_between_threads() {
    fn send<T: Send + 'static>() {}
    send::<SavedPlan>();
    send::<LoadedPlan>();
    send::<PlanFileError>();
}
