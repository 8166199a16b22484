//! OpenCL C → device binary with `clBuildProgram`.
//!
//! The artifact is the program binary (`CL_PROGRAM_BINARIES`), so a cached kernel skips the
//! front end. Binaries are specific to a platform, device and driver: all three are in
//! [`OpenClCompiler::fingerprint`], so a driver upgrade never loads a stale binary.

use std::sync::Arc;

use kiln_device::{CompiledSpec, Compiler, Error, ProgramSpec, Result};
use opencl3::error_codes::CL_BUILD_PROGRAM_FAILURE;
use opencl3::program::Program;

use crate::{ClDevice, driver};

/// Build options passed to every `clBuildProgram`. Strict IEEE semantics (no fast-math) so
/// results match the CPU backend within float tolerance.
pub const BUILD_OPTIONS: &str = "";

/// Compiles OpenCL C for one device.
pub struct OpenClCompiler {
    cl: Arc<ClDevice>,
}

impl OpenClCompiler {
    pub fn new(cl: Arc<ClDevice>) -> OpenClCompiler {
        OpenClCompiler { cl }
    }
}

/// Builds `src` for the device of `cl`; a rejected build is [`Error::Compile`] carrying the
/// build log and, when the log names one, the offending source line.
pub(crate) fn build_source(cl: &ClDevice, src: &str, what: &str) -> Result<Program> {
    let mut program =
        Program::create_from_source(cl.context(), src).map_err(|e| driver("clCreateProgramWithSource", e))?;
    match program.build(&[cl.device_id()], BUILD_OPTIONS) {
        Ok(()) => Ok(program),
        Err(e) => {
            let log = program.get_build_log(cl.device_id()).unwrap_or_default();
            if e.0 != CL_BUILD_PROGRAM_FAILURE && log.trim().is_empty() {
                return Err(driver("clBuildProgram", e));
            }
            Err(Error::Compile {
                message: format!("OpenCL C of `{what}` was rejected by {} ({e})", cl.info.name.trim()),
                line: offending_line(&log, src),
                log: log.trim_end().to_string(),
            })
        }
    }
}

/// The source line a compiler log points at first (`<source>:LINE:COL: error: ...`).
fn offending_line(log: &str, src: &str) -> Option<String> {
    log.lines().filter(|l| l.contains("error")).find_map(|l| {
        let mut parts = l.split(':');
        parts.find_map(|p| {
            let n: usize = p.trim().parse().ok()?;
            let text = src.lines().nth(n.checked_sub(1)?)?;
            Some(format!("{n}: {}", text.trim()))
        })
    })
}

impl Compiler for OpenClCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let program = build_source(&self.cl, &spec.src, &spec.name)?;
        let mut binaries = program.get_binaries().map_err(|e| driver("clGetProgramInfo(CL_PROGRAM_BINARIES)", e))?;
        let bytes = binaries.pop().filter(|b| !b.is_empty()).ok_or_else(|| Error::Compile {
            message: format!("{} returned no program binary for `{}`", self.cl.info.name.trim(), spec.name),
            log: String::new(),
            line: None,
        })?;
        Ok(CompiledSpec { name: spec.name.clone(), bytes, spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        "opencl"
    }

    fn fingerprint(&self) -> String {
        let i = &self.cl.info;
        format!(
            "opencl platform={} {} device={} {} driver={} options={BUILD_OPTIONS:?}",
            i.platform_name.trim(),
            i.platform_version.trim(),
            i.name.trim(),
            i.device_version.trim(),
            i.driver_version.trim()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offending_line_is_found_in_a_clang_log() {
        let src = "__kernel void k(void) {\n  int x = ;\n}\n";
        let log = "<source>:2:11: error: expected expression\n  int x = ;\n          ^\n";
        assert_eq!(offending_line(log, src).as_deref(), Some("2: int x = ;"));
        assert_eq!(offending_line("warning: nothing", src), None);
    }
}
