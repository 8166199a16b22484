// SCRATCH (to delete): runs a WGSL file's `main` with out: array<u32> (64 words) at binding 0.
use kiln_device::kiln_ir::DeviceSpec;
use wgpu::util::DeviceExt;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let src = std::fs::read_to_string(&args[1]).unwrap();
    let groups: u32 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1);
    let gpu = kiln_webgpu::WgpuDevice::open(&DeviceSpec::new("WEBGPU", 0)).unwrap();
    let d = &gpu.device;
    let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let p = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let buf = d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: &[0u8; 256],
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    });
    let rb = d.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bg = d.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &p.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry { binding: 0, resource: buf.as_entire_binding() }],
    });
    let mut e = d.create_command_encoder(&Default::default());
    {
        let mut pass = e.begin_compute_pass(&Default::default());
        pass.set_pipeline(&p);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
    }
    e.copy_buffer_to_buffer(&buf, 0, &rb, 0, 256);
    gpu.queue.submit([e.finish()]);
    rb.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    d.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).unwrap();
    let v = rb.slice(..).get_mapped_range().unwrap();
    let w: Vec<u32> = v.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    println!("{:?} min {} max {}", &w[..16], w.iter().min().unwrap(), w.iter().max().unwrap());
}
