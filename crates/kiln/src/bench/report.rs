//! What a run reports: each entry's statistics, the table and the `--json` report.

use std::borrow::Cow;
use std::fmt::Write as _;

use kiln_device::Device;
use kiln_device::kiln_ir::DeviceSpec;
use serde::Serialize;

use super::kiln_err;
use crate::error::CliError;

/// Median, min and max of one series, in the entry's unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    pub(super) fn of(mut v: Vec<f64>) -> Result<Stats, CliError> {
        if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
            return Err(kiln_err(
                "timing",
                kiln_device::Error::Invalid("a benchmark produced no finite sample".into()),
            ));
        }
        v.sort_by(f64::total_cmp);
        Ok(Stats { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1] })
    }
}

/// One reported line.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub name: &'static str,
    pub unit: &'static str,
    /// True for throughputs (GB/s, GFLOP/s), false for times and the overlap ratio.
    pub higher_is_better: bool,
    pub verified: bool,
    pub kiln: Stats,
    pub baseline: Option<Stats>,
    /// What the baseline is; for an entry without one, what was measured where the entry
    /// picks among variants (`bandwidth_limit`'s fastest kernel), else empty.
    pub baseline_name: Cow<'static, str>,
}

impl BenchResult {
    /// kiln relative to the baseline, higher is better.
    pub fn ratio(&self) -> Option<f64> {
        let b = self.baseline?;
        Some(if self.higher_is_better { self.kiln.median / b.median } else { b.median / self.kiln.median })
    }
}

/// One entry's result with the compiler pair the device compiled its kernels with.
#[derive(Debug, Clone)]
pub struct PairResult {
    pub compiler: String,
    pub result: BenchResult,
}

/// `r` relative to the same entry on the run's first pair (higher is better), for a result of
/// another pair; `None` on the first pair or when the first pair did not run the entry.
fn vs_first(r: &PairResult, all: &[PairResult]) -> Option<f64> {
    let first = &all.first()?.compiler;
    if &r.compiler == first {
        return None;
    }
    let base = all.iter().find(|o| &o.compiler == first && o.result.name == r.result.name)?.result.kiln.median;
    let this = r.result.kiln.median;
    Some(if r.result.higher_is_better { this / base } else { base / this })
}

/// The `--json` report: `{"device": ..., "results": [{"name", "compiler", "verified", "unit",
/// "median", "min", "max", "baseline", "baseline_median", "ratio", "vs_first_compiler"}, ...]}`;
/// a missing or non-finite number is `null`, and so is `baseline` (what the baseline is) for
/// an entry without one. `vs_first_compiler` compares a pair after the first with the first.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    device: String,
    results: Vec<JsonResult<'a>>,
}

#[derive(Debug, Serialize)]
struct JsonResult<'a> {
    name: &'a str,
    compiler: &'a str,
    verified: bool,
    unit: &'a str,
    median: f64,
    min: f64,
    max: f64,
    baseline: Option<&'a str>,
    baseline_median: Option<f64>,
    ratio: Option<f64>,
    vs_first_compiler: Option<f64>,
}

pub(super) fn to_json(device: &DeviceSpec, results: &[PairResult]) -> Result<String, CliError> {
    let report = JsonReport {
        device: device.to_string(),
        results: results
            .iter()
            .map(|pr| (pr, &pr.result))
            .map(|(pr, r)| JsonResult {
                name: r.name,
                compiler: &pr.compiler,
                verified: r.verified,
                unit: r.unit,
                median: r.kiln.median,
                min: r.kiln.min,
                max: r.kiln.max,
                baseline: r.baseline.map(|_| r.baseline_name.as_ref()),
                baseline_median: r.baseline.map(|b| b.median),
                ratio: r.ratio(),
                vs_first_compiler: vs_first(pr, results),
            })
            .collect(),
    };
    let mut text = serde_json::to_string(&report)
        .map_err(|e| kiln_err("writing the JSON report", kiln_device::Error::Invalid(e.to_string())))?;
    text.push('\n');
    Ok(text)
}

pub(super) fn to_table(device: &Device, results: &[PairResult]) -> String {
    let mut s = format!("kiln bench on {} ({})\n\n", device.spec(), device.description());
    let first = results.first().map_or("", |r| r.compiler.as_str());
    let _ = writeln!(
        s,
        "{:<24} {:>9} {:>8} {:>10} {:>10} {:>10}   {:>10} {:>10} {:>10} {:>7} {:>8}  baseline",
        "entry", "compiler", "unit", "median", "min", "max", "b.median", "b.min", "b.max", "ratio", "vs first"
    );
    for pr in results {
        let r = &pr.result;
        let b =
            |f: fn(&Stats) -> f64| r.baseline.as_ref().map(|x| format!("{:.3}", f(x))).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "{:<24} {:>9} {:>8} {:>10.3} {:>10.3} {:>10.3}   {:>10} {:>10} {:>10} {:>7} {:>8}  {}",
            r.name,
            pr.compiler,
            r.unit,
            r.kiln.median,
            r.kiln.min,
            r.kiln.max,
            b(|x| x.median),
            b(|x| x.min),
            b(|x| x.max),
            r.ratio().map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            vs_first(pr, results).map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            r.baseline_name
        );
    }
    s.push_str("\nEvery entry was verified against a host reference before it was timed.\n");
    s.push_str("ratio: kiln / baseline for throughputs, baseline / kiln for times (higher is better).\n");
    if results.iter().any(|r| r.compiler != first) {
        let _ = writeln!(s, "vs first: the same entry on the {first} pair, as ratio is (higher is better).");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_report_escapes_names_and_keeps_its_schema() {
        let stats = Stats { median: 2.0, min: 1.0, max: 3.0 };
        let result = |name, baseline| BenchResult {
            name,
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: stats,
            baseline,
            baseline_name: "OpenBLAS 0.3 \"x\", 2 threads".into(),
        };
        let odd = "q\"uote\\back\nslash";
        let on = |compiler: &str, result| PairResult { compiler: compiler.into(), result };
        let results = [
            on("cc", result(odd, Some(Stats { median: 4.0, ..stats }))),
            on("cc", result("plain", None)),
            on("llvm", BenchResult { kiln: Stats { median: 3.0, ..stats }, ..result("plain", None) }),
        ];
        let json = to_json(&DeviceSpec::new("OPENCL", 1), &results).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["device"], "OPENCL:1");
        let first = &v["results"][0];
        assert_eq!(first["name"], odd);
        assert_eq!(
            first.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()),
            Some(
                [
                    "baseline",
                    "baseline_median",
                    "compiler",
                    "max",
                    "median",
                    "min",
                    "name",
                    "ratio",
                    "unit",
                    "verified",
                    "vs_first_compiler"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!((first["median"].as_f64(), first["baseline_median"].as_f64()), (Some(2.0), Some(4.0)));
        assert_eq!(first["ratio"].as_f64(), Some(0.5));
        assert_eq!(first["baseline"], "OpenBLAS 0.3 \"x\", 2 threads", "the JSON names the baseline");
        let second = &v["results"][1];
        assert!(second["baseline"].is_null() && second["baseline_median"].is_null() && second["ratio"].is_null());
        assert!(first["vs_first_compiler"].is_null() && second["vs_first_compiler"].is_null());
        let third = &v["results"][2];
        assert_eq!((third["compiler"].as_str(), third["vs_first_compiler"].as_f64()), (Some("llvm"), Some(1.5)));
        let nan = [on("cc", BenchResult { kiln: Stats { median: f64::NAN, ..stats }, ..result("nan", None) })];
        let v: serde_json::Value = serde_json::from_str(&to_json(&DeviceSpec::new("CPU", 0), &nan).unwrap()).unwrap();
        assert!(v["results"][0]["median"].is_null(), "a non-finite figure is null, as before");
    }
}
