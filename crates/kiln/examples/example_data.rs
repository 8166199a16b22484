//! Writes the small `.npy` inputs that the command lines in `examples/kernels/*.kiln` use:
//!
//! ```text
//! cargo run -p kiln --example example_data -- examples/data
//! ```
//!
//! - `ramp8.npy`: f32 `[0, 1, ..., 7]`
//! - `ones8.npy`: f32 `[1; 8]`
//! - `two1.npy`:  f32 `[2]`
//! - `ramp256.npy`: f32 `[0, 1, ..., 255]`
//! - `ones900_i32.npy`: i32 `[1; 900]`
//! - `ids8_i32.npy`: i32 `[7, 0, 3, 3, 6, 1, 2, 5]`

use std::path::PathBuf;

use kiln::npy::{self, NpyArray};
use kiln_ir::Scalar;

fn f32s(values: &[f32]) -> Result<Vec<u8>, npy::NpyError> {
    let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy::write(&NpyArray::from_bytes(Scalar::F32, data)?)
}

fn i32s(values: &[i32]) -> Result<Vec<u8>, npy::NpyError> {
    let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy::write(&NpyArray::from_bytes(Scalar::I32, data)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "examples/data".into()));
    std::fs::create_dir_all(&dir)?;
    let ramp = |n: usize| (0..n).map(|i| i as f32).collect::<Vec<f32>>();
    let files = [
        ("ramp8.npy", f32s(&ramp(8))?),
        ("ones8.npy", f32s(&[1.0; 8])?),
        ("two1.npy", f32s(&[2.0])?),
        ("ramp256.npy", f32s(&ramp(256))?),
        ("ones900_i32.npy", i32s(&[1; 900])?),
        ("ids8_i32.npy", i32s(&[7, 0, 3, 3, 6, 1, 2, 5])?),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
