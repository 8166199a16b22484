//! What a run reports: each entry's statistics, the table and the `--json` report.

use std::borrow::Cow;
use std::fmt::Write as _;

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

/// An entry (or one row of it) that could not run on the device, and why: a buffer beyond one
/// of its limits or its memory, a capability it lacks (see [`crate::error::CliError::CannotRun`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub name: &'static str,
    pub reason: String,
}

/// One row of the report: what was measured, or why it could not be.
pub type Row = Result<BenchResult, Skipped>;

/// The row's name, measured or skipped.
pub fn row_name(row: &Row) -> &'static str {
    match row {
        Ok(r) => r.name,
        Err(s) => s.name,
    }
}

/// One entry's result with the compiler pair the device compiled its kernels with.
#[derive(Debug, Clone)]
pub struct PairResult {
    pub compiler: String,
    pub result: Row,
}

/// `r` relative to the same entry on the run's first pair (higher is better), for a result of
/// another pair; `None` on the first pair, when the first pair did not run the entry, or for a
/// skipped row.
fn vs_first(r: &PairResult, all: &[PairResult]) -> Option<f64> {
    let first = &all.first()?.compiler;
    if &r.compiler == first {
        return None;
    }
    let this = r.result.as_ref().ok()?;
    let base = all.iter().find(|o| &o.compiler == first && row_name(&o.result) == this.name)?;
    let base = base.result.as_ref().ok()?.kiln.median;
    let this_median = this.kiln.median;
    Some(if this.higher_is_better { this_median / base } else { base / this_median })
}

/// The `--json` report: `{"device": ..., "results": [{"name", "compiler", "verified", "skipped",
/// "unit", "median", "min", "max", "baseline", "baseline_median", "ratio", "vs_first_compiler"},
/// ...]}`; a missing or non-finite number is `null`, and so is `baseline` (what the baseline is)
/// for an entry without one. `skipped` is `null` for a measured (and verified) row, and for a
/// row that could not run on the device the reason, with `verified` false and every figure and
/// the unit `null`. `vs_first_compiler` compares a pair after the first with the first.
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
    skipped: Option<&'a str>,
    unit: Option<&'a str>,
    median: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    baseline: Option<&'a str>,
    baseline_median: Option<f64>,
    ratio: Option<f64>,
    vs_first_compiler: Option<f64>,
}

pub(super) fn to_json(device: &DeviceSpec, results: &[PairResult]) -> Result<String, CliError> {
    let finite = |x: f64| Some(x).filter(|x| x.is_finite());
    let report = JsonReport {
        device: device.to_string(),
        results: results
            .iter()
            .map(|pr| match &pr.result {
                Ok(r) => JsonResult {
                    name: r.name,
                    compiler: &pr.compiler,
                    verified: r.verified,
                    skipped: None,
                    unit: Some(r.unit),
                    median: finite(r.kiln.median),
                    min: finite(r.kiln.min),
                    max: finite(r.kiln.max),
                    baseline: r.baseline.map(|_| r.baseline_name.as_ref()),
                    baseline_median: r.baseline.and_then(|b| finite(b.median)),
                    ratio: r.ratio().and_then(finite),
                    vs_first_compiler: vs_first(pr, results).and_then(finite),
                },
                Err(skipped) => JsonResult {
                    name: skipped.name,
                    compiler: &pr.compiler,
                    verified: false,
                    skipped: Some(&skipped.reason),
                    unit: None,
                    median: None,
                    min: None,
                    max: None,
                    baseline: None,
                    baseline_median: None,
                    ratio: None,
                    vs_first_compiler: None,
                },
            })
            .collect(),
    };
    let mut text = serde_json::to_string(&report)
        .map_err(|e| kiln_err("writing the JSON report", kiln_device::Error::Invalid(e.to_string())))?;
    text.push('\n');
    Ok(text)
}

/// The report as a table, headed by the device `spec` and its `description`.
pub(super) fn to_table(spec: &DeviceSpec, description: &str, results: &[PairResult]) -> String {
    let mut s = format!("kiln bench on {spec} ({description})\n\n");
    let first = results.first().map_or("", |r| r.compiler.as_str());
    let _ = writeln!(
        s,
        "{:<26} {:>9} {:>8} {:>10} {:>10} {:>10}   {:>10} {:>10} {:>10} {:>7} {:>8}  baseline",
        "entry", "compiler", "unit", "median", "min", "max", "b.median", "b.min", "b.max", "ratio", "vs first"
    );
    for pr in results {
        let r = match &pr.result {
            Ok(r) => r,
            Err(skipped) => {
                let reason = skipped.reason.replace('\n', " ");
                let _ = writeln!(s, "{:<26} {:>9}  skipped: {reason}", skipped.name, pr.compiler);
                continue;
            }
        };
        let b =
            |f: fn(&Stats) -> f64| r.baseline.as_ref().map(|x| format!("{:.3}", f(x))).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "{:<26} {:>9} {:>8} {:>10.3} {:>10.3} {:>10.3}   {:>10} {:>10} {:>10} {:>7} {:>8}  {}",
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
    if results.iter().any(|r| r.result.is_err()) {
        s.push_str("\nEvery entry that ran was verified against a host reference before it was timed; a skipped one\n");
        s.push_str("could not run on this device (a size limit, a capability it lacks), for the reason given.\n");
    } else {
        s.push_str("\nEvery entry was verified against a host reference before it was timed.\n");
    }
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
        let on = |compiler: &str, result| PairResult { compiler: compiler.into(), result: Ok(result) };
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
                    "skipped",
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
        assert!(first["skipped"].is_null() && first["verified"] == true, "a measured row is not skipped");
    }

    /// A row that could not run is in the JSON with its reason (not verified, no figures) and
    /// in the table with its reason, beside the measured rows, and the table says what a
    /// skipped row means.
    #[test]
    fn skipped_rows_are_reported_with_their_reason() {
        let stats = Stats { median: 2.0, min: 1.0, max: 3.0 };
        let measured = BenchResult {
            name: "allreduce_devices/2/1MiB",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: stats,
            baseline: None,
            baseline_name: "".into(),
        };
        let reason = "uploading: beyond a limit of WEBGPU:0: 268435456 B is more than its storage binding limit";
        let results = [
            PairResult { compiler: "wgsl".into(), result: Ok(measured) },
            PairResult {
                compiler: "wgsl".into(),
                result: Err(Skipped { name: "allreduce_devices/2/256MiB", reason: reason.into() }),
            },
        ];
        let v: serde_json::Value =
            serde_json::from_str(&to_json(&DeviceSpec::new("WEBGPU", 0), &results).unwrap()).unwrap();
        let skipped = &v["results"][1];
        assert_eq!(skipped["name"], "allreduce_devices/2/256MiB");
        assert_eq!(skipped["skipped"], reason);
        assert_eq!(skipped["verified"], false);
        assert!(["median", "min", "max", "unit", "ratio"].iter().all(|k| skipped[k].is_null()), "{skipped}");
        assert!(v["results"][0]["skipped"].is_null());
        let table = to_table(&DeviceSpec::new("WEBGPU", 0), "lavapipe", &results);
        assert!(table.contains(&format!("allreduce_devices/2/256MiB      wgsl  skipped: {reason}")), "{table}");
        assert!(table.contains("a skipped one\ncould not run on this device"), "{table}");
    }
}
