//! The SPIR-V naga writes for kiln kernels passes `spirv-val` (apt `spirv-tools`). Skipped
//! when `spirv-val` is not installed, unless `KILN_REQUIRE` names `webgpu`.

use std::process::Command;

use kiln_device::Renderer;
use kiln_device::kiln_ir::{DeviceSpec, parse_kernel};
use kiln_webgpu::{BACKEND, Caps, Emit, WgslRenderer, translate};

#[test]
fn every_example_kernel_is_valid_spirv() {
    if let Err(e) = Command::new("spirv-val").arg("--version").output() {
        kiln_device::testing::skip_unless_required(
            "webgpu",
            "every_example_kernel_is_valid_spirv",
            &format!("spirv-val: {e}"),
        );
        return;
    }
    let caps = Caps { f16: true, int64: true };
    let renderer = WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kiln"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no kernels in {}", root.display());
    let dir = tempfile::tempdir().unwrap();
    for file in files {
        let sink = parse_kernel(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let spec = renderer.render(&sink, Some("k")).unwrap();
        let spirv = translate(&spec.src, caps, Emit::Spirv, "k").unwrap();
        let out = dir.path().join("k.spv");
        std::fs::write(&out, &spirv).unwrap();
        let run = Command::new("spirv-val").args(["--target-env", "vulkan1.1"]).arg(&out).output().unwrap();
        assert!(
            run.status.success(),
            "{}: spirv-val rejects naga's SPIR-V:\n{}{}",
            file.display(),
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        let msl = translate(&spec.src, caps, Emit::Msl, "k").unwrap();
        assert!(String::from_utf8(msl).unwrap().contains("kernel"), "{}: MSL has no kernel", file.display());
    }
}
