//! OpenCL C from the kernel IR.

use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, UOp};
use kiln_device::{Error, ProgramSpec, Renderer, Result};

use crate::ClDevice;

/// Renders kernels as OpenCL C for one device.
pub struct OpenClRenderer {
    device: DeviceSpec,
}

impl OpenClRenderer {
    pub fn new(cl: &ClDevice) -> OpenClRenderer {
        OpenClRenderer { device: cl.spec.clone() }
    }
}

impl Renderer for OpenClRenderer {
    fn render(&self, _ast: &Arc<UOp>, _name: Option<&str>) -> Result<ProgramSpec> {
        Err(Error::Render("the OpenCL renderer is not built yet".into()))
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    fn cache_key(&self) -> String {
        "opencl-c v0".into()
    }
}
