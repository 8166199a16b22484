//! WGSL → a validated shader, with naga (wgpu's own shader translator).
//!
//! The artefact is the WGSL text, validated by naga at compile time with exactly the
//! capabilities the adapter offers: a render bug is [`Error::Compile`] carrying naga's
//! diagnostic, never a device error at load time. The fingerprint names the adapter (name,
//! driver, backend, features), so a cached kernel is never reused on another adapter.
//!
//! [`translate`] also prints a kernel as SPIR-V (disassembly-free words) or MSL text, as
//! `kiln compile --target webgpu --emit spirv|msl` does.

use std::sync::Arc;

use kiln_device::{CompiledSpec, Compiler, Error, ProgramSpec, Result};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};

use crate::renderer::Caps;

/// The naga capabilities matching the adapter's features.
fn capabilities(caps: Caps) -> Capabilities {
    let mut c = Capabilities::empty();
    c.set(Capabilities::SHADER_FLOAT16, caps.f16);
    c.set(Capabilities::SHADER_INT64, caps.int64);
    c
}

/// Parses and validates `src`; a rejection is [`Error::Compile`] with naga's diagnostic.
pub fn validate(src: &str, caps: Caps, what: &str) -> Result<(naga::Module, ModuleInfo)> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| Error::Compile {
        message: format!("naga rejected the WGSL of `{what}`: {e}"),
        log: e.emit_to_string(src),
        line: None,
    })?;
    let info =
        Validator::new(ValidationFlags::all(), capabilities(caps)).validate(&module).map_err(|e| Error::Compile {
            message: format!("naga found the WGSL of `{what}` invalid: {}", e.as_inner()),
            log: e.emit_to_string(src),
            line: None,
        })?;
    Ok((module, info))
}

/// A shader language naga writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// The WGSL the renderer wrote.
    Wgsl,
    /// A SPIR-V 1.3 module (little-endian words), as the Vulkan backend runs it.
    Spirv,
    /// Metal Shading Language 2.4 source (it cannot be compiled on this machine).
    Msl,
}

/// `src` in language `emit`, through naga (a work-group size that each launch sets is 1).
pub fn translate(src: &str, caps: Caps, emit: Emit, what: &str) -> Result<Vec<u8>> {
    let (module, info) = validate(src, caps, what)?;
    // A work-group size set per launch takes its default (1) here.
    let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, None, &Default::default())
        .map_err(|e| Error::Compile {
        message: format!("naga could not resolve the overridable constants of `{what}`: {e}"),
        log: String::new(),
        line: None,
    })?;
    let failed = |lang: &str, e: &dyn std::fmt::Display| Error::Compile {
        message: format!("naga could not write `{what}` as {lang}: {e}"),
        log: String::new(),
        line: None,
    };
    match emit {
        Emit::Wgsl => Ok(src.as_bytes().to_vec()),
        Emit::Spirv => {
            let options = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
            let words = naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| failed("SPIR-V", &e))?;
            Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
        }
        Emit::Msl => {
            let options = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
            let (text, _) = naga::back::msl::write_string(&module, &info, &options, &Default::default())
                .map_err(|e| failed("MSL", &e))?;
            Ok(text.into_bytes())
        }
    }
}

/// Validates WGSL for one adapter.
pub struct WgslCompiler {
    caps: Caps,
    adapter: String,
}

impl WgslCompiler {
    /// A compiler for an adapter with `caps`, identified by `adapter` (name, driver, backend).
    pub fn new(caps: Caps, adapter: String) -> WgslCompiler {
        WgslCompiler { caps, adapter }
    }
}

impl Compiler for WgslCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        validate(&spec.src, self.caps, &spec.name)?;
        Ok(CompiledSpec { name: spec.name.clone(), bytes: spec.src.as_bytes().to_vec(), spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        "webgpu"
    }

    fn fingerprint(&self) -> String {
        format!("webgpu naga=30 adapter={} caps={:?}", self.adapter, self.caps)
    }
}
