//! Compute pipelines: a compiled kernel's WGSL becomes a shader module and a pipeline with
//! an explicit layout (binding 0: the argument block; binding `1 + slot`: buffer `slot`).
//!
//! A launch writes the argument block (kiln's work-group counts, each view's element offset,
//! the variables), binds every buffer whole, and dispatches the 2-D grid of
//! [`renderer::grid`](crate::renderer::grid). [`Program::execute`] waits for it;
//! [`WgpuProgram::encode`] only records it (the queues submit).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kiln_device::{CompiledSpec, Error, LaunchDims, Program, ProgramSpec, RawView, Result};

use crate::loops::LoopPlan;
use crate::renderer::{ARGS, WORK_GROUP_OVERRIDES, grid, group_counts, work_group_size};
use crate::{WgpuDevice, driver};

/// A loaded kernel: its shader module and pipelines on one wgpu device.
pub struct WgpuProgram {
    gpu: Arc<WgpuDevice>,
    spec: Arc<ProgramSpec>,
    name: String,
    /// The work-group size fixed in the shader, or `None` when each launch gives it (the
    /// shader's `@workgroup_size` is then pipeline-overridable, one pipeline per size).
    fixed: Option<[u32; 3]>,
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    module: wgpu::ShaderModule,
    /// The kernel's loops as the renderer laid them out for this adapter's loop budget: a
    /// launch that needs more loop passes per work item than the adapter runs is refused.
    loops: LoopPlan,
    /// The pipelines built so far, by work-group size; a size beyond the device's limits
    /// maps to why every launch with it is refused.
    pipelines: Mutex<HashMap<[u32; 3], std::result::Result<wgpu::ComputePipeline, String>>>,
}

impl WgpuProgram {
    /// Builds the shader module of `compiled` (its bytes are WGSL) and, for a fixed
    /// work-group size, its pipeline.
    pub fn load(gpu: Arc<WgpuDevice>, compiled: &CompiledSpec) -> Result<WgpuProgram> {
        gpu.check_lost()?;
        let src = std::str::from_utf8(&compiled.bytes)
            .map_err(|e| Error::Load(format!("kernel `{}` is not WGSL text: {e}", compiled.name)))?;
        let spec = compiled.spec.clone();
        let fixed = work_group_size(&spec)?;
        // The renderer planned the loops from the same linear order (see `WgslRenderer::render`).
        let loops = match gpu.loop_budget {
            Some(budget) => LoopPlan::new(&kiln_device::kiln_ir::linearize(&spec.ast)?, Some(budget)),
            None => LoopPlan::default(),
        };
        let l = &gpu.limits;
        let storage = |binding: u32| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }];
        entries.extend(spec.params.iter().map(|p| storage(p.slot as u32 + 1)));
        if spec.params.len() as u32 > l.max_storage_buffers_per_shader_stage {
            return Err(Error::Load(format!(
                "kernel `{}` takes {} buffers; {} binds at most {} per kernel",
                compiled.name,
                spec.params.len(),
                gpu.spec,
                l.max_storage_buffers_per_shader_stage
            )));
        }
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout =
            gpu.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries });
        let pipeline_layout = gpu.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&compiled.name),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        if let Some(e) = crate::ready("pop_error_scope", scope.pop())? {
            return Err(Error::Load(format!("wgpu refused the shader of `{}`: {e}", compiled.name)));
        }
        let program = WgpuProgram {
            name: compiled.name.clone(),
            gpu,
            spec,
            fixed,
            layout,
            pipeline_layout,
            module,
            loops,
            pipelines: Mutex::new(HashMap::new()),
        };
        if let Some(group) = fixed {
            // Built now, so a pipeline wgpu refuses fails the load, not a launch.
            if let Err(Error::Load(m)) = program.pipeline(group) {
                return Err(Error::Load(m));
            }
        }
        Ok(program)
    }

    /// The pipeline for work groups of `group` items, built on first use; [`Error::Launch`]
    /// when the device cannot run groups that large.
    pub(crate) fn pipeline(&self, group: [u32; 3]) -> Result<wgpu::ComputePipeline> {
        let mut built = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = built.get(&group) {
            return p.clone().map_err(Error::Launch);
        }
        let l = &self.gpu.limits;
        let per_axis = [l.max_compute_workgroup_size_x, l.max_compute_workgroup_size_y, l.max_compute_workgroup_size_z];
        let total: u64 = group.iter().map(|g| *g as u64).product();
        if group.iter().zip(per_axis).any(|(g, m)| *g > m) || total > l.max_compute_invocations_per_workgroup as u64 {
            let why = format!(
                "kernel `{}` has work groups of {group:?} items; {} allows at most {per_axis:?} per axis and {} in all",
                self.name, self.gpu.spec, l.max_compute_invocations_per_workgroup
            );
            built.insert(group, Err(why.clone()));
            return Err(Error::Launch(why));
        }
        let constants: Vec<(&str, f64)> = match self.fixed {
            Some(_) => Vec::new(),
            None => WORK_GROUP_OVERRIDES.iter().zip(group).map(|(name, g)| (*name, f64::from(g))).collect(),
        };
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = self.gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&self.name),
            layout: Some(&self.pipeline_layout),
            module: &self.module,
            entry_point: Some("kiln_main"),
            compilation_options: wgpu::PipelineCompilationOptions { constants: &constants, ..Default::default() },
            cache: self.gpu.pipeline_cache.as_ref(),
        });
        if let Some(e) = crate::ready("pop_error_scope", scope.pop())? {
            return Err(Error::Load(format!("wgpu refused the pipeline of `{}`: {e}", self.name)));
        }
        built.insert(group, Ok(pipeline.clone()));
        Ok(pipeline)
    }

    /// The device the pipeline was built on.
    pub fn device(&self) -> &Arc<WgpuDevice> {
        &self.gpu
    }

    /// The work-group size, kiln's group counts and the dispatch grid of a launch, or why it
    /// cannot be dispatched.
    pub fn grid(&self, launch: &LaunchDims) -> Result<([u32; 3], [u64; 3], [u32; 3])> {
        let group = match (self.fixed, launch.local) {
            (Some(fixed), Some(local)) if local != fixed.map(|g| g as usize) => {
                return Err(Error::Launch(format!(
                    "kernel `{}` was compiled for work groups of {fixed:?}, launched with {local:?}",
                    self.name
                )));
            }
            (Some(fixed), _) => fixed,
            (None, Some(local)) => {
                let mut g = [1u32; 3];
                for (slot, l) in g.iter_mut().zip(local) {
                    *slot = u32::try_from(l).map_err(|_| {
                        Error::Launch(format!("kernel `{}`: a work group of {local:?} items is too large", self.name))
                    })?;
                }
                g
            }
            (None, None) => {
                return Err(Error::Launch(format!("kernel `{}` needs its work-group size at launch", self.name)));
            }
        };
        let groups = group_counts(self.spec.local_size.is_none(), launch.global, group);
        let grid = grid(groups).filter(|_| groups.iter().all(|g| *g <= u32::MAX as u64)).ok_or_else(|| {
            Error::Launch(format!("kernel `{}`: {groups:?} work groups are more than one dispatch holds", self.name))
        })?;
        Ok((group, groups, grid))
    }

    /// Records the launch into `encoder`; with `timestamps`, its compute pass writes its
    /// start and end times into queries 0 and 1 of that set.
    pub fn encode(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        bufs: &[RawView],
        vals: &[i64],
        launch: &LaunchDims,
        timestamps: Option<&wgpu::QuerySet>,
    ) -> Result<()> {
        let (group, groups, grid) = self.grid(launch)?;
        self.loops.check_launch(&self.name, &self.gpu.spec.to_string(), &self.spec.var_names, vals)?;
        let pipeline = self.pipeline(group)?;
        let mut words = [0u32; ARGS];
        words[..3].copy_from_slice(&groups.map(|g| g as u32));
        let mut buffers = Vec::with_capacity(self.spec.params.len());
        for (k, p) in self.spec.params.iter().enumerate() {
            let view = bufs.get(p.slot).ok_or_else(|| {
                Error::Launch(format!("kernel `{}` takes buffer {}, got {} buffer(s)", self.name, p.slot, bufs.len()))
            })?;
            let size = p.scalar.size();
            if view.offset % size != 0 {
                return Err(Error::Launch(format!(
                    "buffer {} of kernel `{}` is a view at byte {}, not on a {} element",
                    p.slot,
                    self.name,
                    view.offset,
                    p.scalar.name()
                )));
            }
            words[3 + k] = u32::try_from(view.offset / size)
                .map_err(|_| Error::Launch(format!("buffer {} starts past 2^32 elements", p.slot)))?;
            buffers.push((p.slot, self.gpu.buffer(view.base)?));
        }
        for (i, v) in vals.iter().enumerate() {
            let v = i32::try_from(*v).map_err(|_| {
                Error::Launch(format!("variable {i} = {v} of kernel `{}` does not fit an i32", self.name))
            })?;
            words[3 + self.spec.params.len() + i] = v as u32;
        }
        let args = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln args"),
            size: (ARGS * 4) as u64,
            usage: wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: true,
        });
        args.get_mapped_range_mut(..)
            .map_err(|e| driver("get_mapped_range_mut", e, false))?
            .copy_from_slice(&words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>());
        args.unmap();
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: args.as_entire_binding() }];
        entries.extend(
            buffers
                .iter()
                .map(|(slot, b)| wgpu::BindGroupEntry { binding: *slot as u32 + 1, resource: b.as_entire_binding() }),
        );
        let bind = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.layout,
            entries: &entries,
        });
        let timestamp_writes = timestamps.map(|query_set| wgpu::ComputePassTimestampWrites {
            query_set,
            beginning_of_pass_write_index: Some(0),
            end_of_pass_write_index: Some(1),
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        Ok(())
    }
}

impl Program for WgpuProgram {
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()> {
        self.gpu.check_lost()?;
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        self.encode(&mut encoder, bufs, vals, launch, None)?;
        let index = self.gpu.submit(Some(encoder))?;
        self.gpu.wait(Some(index))
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// wgpu's own round trip, a baseline for kiln's queue round trip: one dispatch of an empty
/// shader, submitted and waited for, on a wgpu device of its own (the same adapter).
pub struct EmptyDispatch {
    gpu: Arc<WgpuDevice>,
    pipeline: wgpu::ComputePipeline,
}

impl EmptyDispatch {
    /// The empty pipeline on a new wgpu device of `spec`'s adapter.
    pub fn new(spec: &kiln_device::kiln_ir::DeviceSpec) -> Result<EmptyDispatch> {
        let gpu = Arc::new(WgpuDevice::open(spec)?);
        let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("empty"),
            source: wgpu::ShaderSource::Wgsl("@compute @workgroup_size(1) fn main() {}".into()),
        });
        let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("empty"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        Ok(EmptyDispatch { gpu, pipeline })
    }

    /// One dispatch, submitted and waited for.
    pub fn run(&self) -> Result<()> {
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.dispatch_workgroups(1, 1, 1);
        }
        let index = self.gpu.submit(Some(encoder))?;
        self.gpu.wait(Some(index))
    }
}
