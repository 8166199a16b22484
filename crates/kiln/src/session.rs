//! What every kernel-running command shares: opening a device, reading a kernel file,
//! compiling it and binding `--var` values. `run` uses it today; `bench` (its own module,
//! added beside `run`) builds on the same functions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_device::{Device, Kernel, ProgramSpec};
use kiln_ir::{DeviceSpec, UOp};

use crate::error::{CliError, Context};

/// `cmd` with the help of every subcommand's `--device` completed by the registered backends:
/// `The device to run on: CPU, OPENCL, CUDA or WEBGPU (NAME:n for device n)`.
pub fn with_device_help(cmd: clap::Command) -> clap::Command {
    let names = kiln_device::device_names();
    cmd.mut_subcommands(|sub| {
        if !sub.get_arguments().any(|a| a.get_id() == "device") {
            return sub;
        }
        sub.mut_arg("device", |arg| {
            let what = arg.get_help().map(ToString::to_string).unwrap_or_else(|| "The device".into());
            arg.help(format!("{what}: {names} (NAME:n for a backend's device n)"))
        })
    })
}

/// A kernel read from a text file.
pub struct KernelFile {
    pub path: PathBuf,
    /// The entry-point name: the file stem made into a C identifier (`add.kiln` → `add`).
    pub name: String,
    pub sink: Arc<UOp>,
    /// The file's text, to name the line of a node an error reports by number.
    pub text: String,
}

impl KernelFile {
    /// Reads and parses `path`. Parse errors carry the line and column.
    pub fn load(path: &Path) -> Result<KernelFile, CliError> {
        let text = kiln_ir::read_kernel_file(path).map_err(|e| CliError::io("cannot read kernel file", path, e))?;
        let sink = kiln_ir::parse_kernel(&text).context(|| format!("cannot parse kernel {}", path.display()))?;
        kiln_ir::check_chain_depth(&sink).context(|| format!("cannot compile kernel {}", path.display()))?;
        Ok(KernelFile { path: path.to_path_buf(), name: kiln_ir::entry_name(path), sink, text })
    }

    /// Renders, compiles and loads the kernel on `device` (through the kernel cache).
    pub fn compile(&self, device: &Device) -> Result<Kernel, CliError> {
        device.compile(&self.sink, Some(&self.name)).context(|| self.doing("compile", device.spec()))
    }

    /// Renders the kernel for `device` without compiling it.
    pub fn render(&self, device: &Device) -> Result<ProgramSpec, CliError> {
        device.renderer().render(&self.sink, Some(&self.name)).context(|| self.doing("render", device.spec()))
    }

    /// `err` with the line of the kernel file that defines the access it names, when it is an
    /// access the bounds proof refused or whose guard fired (the device layer numbers nodes,
    /// the user reads lines).
    pub fn locate(&self, err: CliError) -> CliError {
        if let CliError::Kiln { context, source } = &err
            && let kiln_device::Error::OutOfBounds { access, .. } = source.root_cause()
            && let Some(at) = kiln_ir::locate_node(&self.text, access.node)
        {
            let what =
                if access.guarded { "left its buffer (its guard skipped it)" } else { "is not proven in bounds" };
            return CliError::Kiln { context: format!("{context}: the access at {at} {what}"), source: source.clone() };
        }
        err
    }

    fn doing(&self, verb: &str, device: &DeviceSpec) -> String {
        format!("cannot {verb} {} for {device}", self.path.display())
    }
}

/// Opens a device by name (`CPU`, `OPENCL:0`, ...), with its compiler pair `compiler` as the
/// default where one is given (`--compiler cc-avx2`; `kiln devices` lists each device's pairs).
pub fn open_device(spec: &DeviceSpec, compiler: Option<&str>) -> Result<Arc<Device>, CliError> {
    let device = kiln_device::open_device(&spec.to_string()).context(|| format!("cannot open device {spec}"))?;
    match compiler {
        None => Ok(device),
        Some(name) => Ok(Arc::new(
            device.with_default_compiler(name).context(|| format!("cannot open device {spec} with compiler {name}"))?,
        )),
    }
}

/// Parses `--device` text (a clap value parser: the message follows clap's "invalid value"):
/// a device of a registered backend.
pub fn parse_device(text: &str) -> Result<DeviceSpec, String> {
    let spec: DeviceSpec = text.parse().map_err(|e: kiln_ir::IrError| e.to_string())?;
    match kiln_device::find_backend(spec.base_type()) {
        Some(_) => Ok(spec),
        None => Err(format!("unknown device `{text}` (this kiln's backends: {})", kiln_device::device_names())),
    }
}

/// Parses `--var NAME=VALUE` (a clap value parser).
pub fn parse_var(text: &str) -> Result<(String, i64), String> {
    let (name, value) = split_pair(text, "NAME=VALUE (e.g. --var n=1024)")?;
    let value = value.trim().parse::<i64>().map_err(|_| format!("`{value}` is not a 64-bit integer"))?;
    Ok((name, value))
}

/// Splits `NAME=VALUE` (for `--var`, `--in`, `--out`); `example` says what was expected.
pub fn split_pair(text: &str, example: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected {example}")),
    }
}

/// The values of the kernel's variables in `var_names` order, each checked against its
/// bounds. A variable without a value or a `--var` the kernel does not declare is an error
/// (a variable given twice is refused earlier, as a usage error).
pub fn bind_vars(spec: &ProgramSpec, given: &[(String, i64)]) -> Result<Vec<i64>, CliError> {
    for (name, _) in given {
        if !spec.var_names.contains(name) {
            let declared = if spec.var_names.is_empty() {
                "it declares no variables".to_string()
            } else {
                format!("its variables are: {}", spec.var_names.join(", "))
            };
            return Err(CliError::Mismatch(format!("--var {name}: the kernel has no variable `{name}`; {declared}")));
        }
    }
    let vals = spec
        .vars
        .iter()
        .map(|v| {
            given
                .iter()
                .find(|(n, _)| *n == v.name)
                .map(|(_, x)| *x)
                .ok_or_else(|| kiln_ir::IrError::MissingVar(v.name.clone()))
        })
        .collect::<Result<Vec<i64>, _>>()
        .context(|| {
            let missing = spec.vars.iter().find(|v| !given.iter().any(|(n, _)| *n == v.name));
            let hint = missing.map(|v| format!(" (pass --var {}=N)", v.name)).unwrap_or_default();
            format!("cannot bind the variables of kernel `{}`{hint}", spec.name)
        })?;
    spec.check_vals(&vals).context(|| format!("cannot bind the variables of kernel `{}`", spec.name))?;
    Ok(vals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_kernel_parses_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "kiln") {
                let k = KernelFile::load(&path).unwrap_or_else(|e| panic!("{}: {}", path.display(), e.report()));
                let spec = ProgramSpec::from_sink(&k.name, String::new(), DeviceSpec::new("CPU", 0), &k.sink).unwrap();
                assert!(!spec.outs.is_empty(), "{} writes nothing", path.display());
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(text.contains("kiln run examples/kernels/"), "{} has no example command", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 5, "found {seen} example kernels in {}", dir.display());
    }

    #[test]
    fn vars_parse_strictly() {
        assert_eq!(parse_var("n=1024").unwrap(), ("n".into(), 1024));
        assert_eq!(parse_var("n=-3").unwrap(), ("n".into(), -3));
        assert_eq!(parse_var("n=1e3").unwrap_err(), "`1e3` is not a 64-bit integer");
        assert!(parse_var("n=99999999999999999999").is_err());
        assert!(parse_var("n").unwrap_err().contains("expected NAME=VALUE"));
        assert!(parse_var("=3").is_err());
        assert_eq!(split_pair("0=a=b.npy", "").unwrap(), ("0".into(), "a=b.npy".into()));
    }

    #[test]
    fn binding_checks_names_and_bounds() {
        let mut k = kiln_ir::KernelBuilder::new();
        let n = k.var("n", 1, 100);
        let a = k.param(0, kiln_ir::Scalar::F32, &n);
        let i = k.global(0, &n);
        k.store(&a.at(&i), &kiln_ir::Val::f32(1.0));
        let sink = k.finish().unwrap();
        let spec = ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &sink).unwrap();
        assert_eq!(bind_vars(&spec, &[("n".into(), 5)]).unwrap(), vec![5]);
        let missing = bind_vars(&spec, &[]).unwrap_err().report();
        assert!(missing.contains("variable `n` has no value"), "{missing}");
        let outside = bind_vars(&spec, &[("n".into(), 500)]).unwrap_err().report();
        assert!(outside.contains("outside its bounds [1, 100]"), "{outside}");
        let extra = bind_vars(&spec, &[("n".into(), 5), ("m".into(), 1)]).unwrap_err().report();
        assert!(extra.contains("no variable `m`; its variables are: n"), "{extra}");
    }
}
