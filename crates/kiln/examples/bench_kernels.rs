//! Writes the benchmark kernels to `examples/kernels/bench/` in the kiln text format.
//! A test (`bench::kernels::tests`) checks the committed files against the builder.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels/bench");
    std::fs::create_dir_all(&dir)?;
    for (file, sink) in kiln::bench::kernels::shipped()? {
        let header = format!(
            "# {file}: a kiln benchmark kernel, built by crates/kiln/src/bench/kernels.rs.\n\
             # `kiln bench` runs it; `kiln compile examples/kernels/bench/{file}` shows its C.\n"
        );
        std::fs::write(dir.join(file), header + &kiln_device::kiln_ir::print(&sink))?;
        println!("wrote {}", dir.join(file).display());
    }
    Ok(())
}
