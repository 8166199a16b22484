//! Writes the small `.npy` inputs that the command lines in `examples/kernels/*.kiln` use:
//!
//! ```text
//! cargo run -p kiln --example example_data -- examples/data
//! ```
//!
//! - `ramp8.npy`: f32 `[0, 1, ..., 7]`
//! - `ones8.npy`: f32 `[1; 8]`
//! - `two1.npy`:  f32 `[2]`

use std::path::PathBuf;

use kiln::npy::{self, NpyArray};
use kiln_ir::Scalar;

fn f32s(values: &[f32]) -> Result<Vec<u8>, npy::NpyError> {
    let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy::write(&NpyArray::from_bytes(Scalar::F32, data)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "examples/data".into()));
    std::fs::create_dir_all(&dir)?;
    let ramp: Vec<f32> = (0..8).map(|i| i as f32).collect();
    for (name, values) in [("ramp8.npy", ramp), ("ones8.npy", vec![1.0; 8]), ("two1.npy", vec![2.0])] {
        let path = dir.join(name);
        std::fs::write(&path, f32s(&values)?)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
