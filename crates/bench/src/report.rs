//! The report: what machine ran the benchmark, and per workload the medians over rounds of
//! each daemon's ops/s and CPU seconds with the ratios ours/reference, as aligned text or as a
//! markdown table.

use std::fmt::Write as _;
use std::fs;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::daemon::DaemonSpec;
use crate::tree::TreeStats;
use crate::workloads::{Measured, Workload, GETATTR_PASSES};

/// The machine the benchmark ran on.
#[derive(Debug, Clone)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    pub date: String,
}

impl Machine {
    /// Reads `/proc/cpuinfo`, the kernel release and the clock.
    pub fn probe() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or_else(|_| {
                cpuinfo
                    .lines()
                    .filter(|l| l.starts_with("processor"))
                    .count()
            });
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Machine {
            cpu,
            cores,
            kernel,
            date: utc_date(secs),
        }
    }

    /// One line.
    pub fn summary(&self) -> String {
        format!(
            "{}, {} cores, Linux {}, {}",
            self.cpu, self.cores, self.kernel, self.date
        )
    }
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time.
fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Everything the report says besides the numbers.
#[derive(Debug, Clone)]
pub struct Header {
    pub machine: Machine,
    /// Command line of each daemon.
    pub specs: Vec<String>,
    pub tree: String,
    pub stats: TreeStats,
    pub rounds: usize,
    pub cache: String,
    pub queue_size: u16,
    pub seq_depth: usize,
    pub create_files: usize,
    pub seq_passes: u64,
    pub max_held: usize,
    pub nofile: Option<u64>,
    pub straced: bool,
}

impl Header {
    fn lines(&self) -> Vec<String> {
        let mut v = vec![
            format!("machine: {}", self.machine.summary()),
            format!(
                "tree: {} ({} entries: {} directories, {} files)",
                self.tree, self.stats.entries, self.stats.dirs, self.stats.files
            ),
            format!(
                "settings: --cache {}, {} round(s), 1 request queue of {} descriptors, \
                 seq-read {} pass(es) at depth {}, create-unlink {} files, getattr {} passes, \
                 walks hold {}{}",
                self.cache,
                self.rounds,
                self.queue_size,
                self.seq_passes,
                self.seq_depth,
                self.create_files,
                GETATTR_PASSES,
                if self.max_held == 0 {
                    "every reference until the end".to_string()
                } else {
                    format!("at most ~{} references", self.max_held)
                },
                match self.nofile {
                    Some(n) => format!(", daemons' RLIMIT_NOFILE {n}"),
                    None => String::new(),
                }
            ),
        ];
        for s in &self.specs {
            v.push(format!("daemon: {s}"));
        }
        v.push(
            "values: medians over rounds; CPU = user+system time of the daemon's process tree"
                .into(),
        );
        if self.straced {
            v.push("WARNING: run under strace; timings are not representative".into());
        }
        v
    }
}

/// One row of the result table.
struct Row {
    workload: Workload,
    ops: u64,
    ops_s: Vec<Option<f64>>,
    cpu_s: Vec<Option<f64>>,
    mib_s: Vec<Option<f64>>,
}

/// Measurements of every daemon and workload, over rounds.
pub struct Results {
    workloads: Vec<Workload>,
    labels: Vec<&'static str>,
    runs: Vec<(&'static str, Workload, Measured)>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".into(),
    }
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) => format!("{x:.decimals$}"),
        None => "–".into(),
    }
}

impl Results {
    pub fn new(workloads: &[Workload], specs: &[DaemonSpec]) -> Self {
        Results {
            workloads: workloads.to_vec(),
            labels: specs.iter().map(|s| s.label).collect(),
            runs: Vec::new(),
        }
    }

    pub fn add(&mut self, label: &'static str, w: Workload, m: Measured) {
        self.runs.push((label, w, m));
    }

    fn rows(&self) -> Vec<Row> {
        self.workloads
            .iter()
            .map(|&w| {
                let per = |f: &dyn Fn(&Measured) -> f64| -> Vec<Option<f64>> {
                    self.labels
                        .iter()
                        .map(|l| {
                            median(
                                self.runs
                                    .iter()
                                    .filter(|(rl, rw, _)| rl == l && *rw == w)
                                    .map(|(_, _, m)| f(m))
                                    .collect(),
                            )
                        })
                        .collect()
                };
                let ops = self
                    .runs
                    .iter()
                    .find(|(_, rw, _)| *rw == w)
                    .map(|(_, _, m)| m.ops)
                    .unwrap_or(0);
                Row {
                    workload: w,
                    ops,
                    ops_s: per(&|m| m.ops_per_sec()),
                    cpu_s: per(&|m| m.daemon_cpu.total().as_secs_f64()),
                    mib_s: per(&|m| m.mib_per_sec()),
                }
            })
            .collect()
    }

    fn has_reference(&self) -> bool {
        self.labels.len() > 1
    }

    fn cells(&self, r: &Row) -> Vec<String> {
        let cpu_us = |i: usize| r.cpu_s[i].map(|c| c * 1e6 / r.ops.max(1) as f64);
        let mut c = vec![
            r.workload.name().to_string(),
            format!("{} {}", r.ops, r.workload.op_unit()),
            num(r.ops_s[0], 0),
        ];
        if self.has_reference() {
            c.push(num(r.ops_s[1], 0));
            c.push(ratio(r.ops_s[0], r.ops_s[1]));
        }
        c.push(num(r.cpu_s[0], 2));
        if self.has_reference() {
            c.push(num(r.cpu_s[1], 2));
            c.push(ratio(r.cpu_s[0], r.cpu_s[1]));
        }
        c.push(num(cpu_us(0), 1));
        if self.has_reference() {
            c.push(num(cpu_us(1), 1));
        }
        c
    }

    fn titles(&self) -> Vec<&'static str> {
        if self.has_reference() {
            vec![
                "workload",
                "ops per run",
                "ours ops/s",
                "ref ops/s",
                "ops/s ours/ref",
                "ours CPU s",
                "ref CPU s",
                "CPU ours/ref",
                "ours CPU µs/op",
                "ref CPU µs/op",
            ]
        } else {
            vec![
                "workload",
                "ops per run",
                "ours ops/s",
                "ours CPU s",
                "ours CPU µs/op",
            ]
        }
    }

    fn throughput_lines(&self, rows: &[Row]) -> Vec<String> {
        rows.iter()
            .filter(|r| r.workload == Workload::SeqRead1m)
            .map(|r| {
                let mut s = format!("seq-read-1m throughput: ours {} MiB/s", num(r.mib_s[0], 1));
                if self.has_reference() {
                    let _ = write!(
                        s,
                        ", reference {} MiB/s (ours/ref {})",
                        num(r.mib_s[1], 1),
                        ratio(r.mib_s[0], r.mib_s[1])
                    );
                }
                s
            })
            .collect()
    }

    /// Aligned plain-text report.
    pub fn text(&self, h: &Header) -> String {
        let mut out = String::new();
        for l in h.lines() {
            let _ = writeln!(out, "{l}");
        }
        out.push('\n');
        let rows = self.rows();
        let titles = self.titles();
        let table: Vec<Vec<String>> = rows.iter().map(|r| self.cells(r)).collect();
        let widths: Vec<usize> = titles
            .iter()
            .enumerate()
            .map(|(i, t)| {
                table
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([t.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let pad = widths[i].saturating_sub(c.chars().count());
                    if i == 0 {
                        format!("{c}{}", " ".repeat(pad))
                    } else {
                        format!("{}{c}", " ".repeat(pad))
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let _ = writeln!(
            out,
            "{}",
            line(titles.iter().map(|s| s.to_string()).collect())
        );
        for r in table {
            let _ = writeln!(out, "{}", line(r));
        }
        for l in self.throughput_lines(&rows) {
            let _ = writeln!(out, "\n{l}");
        }
        out
    }

    /// Markdown report: the header as a list, then the table.
    pub fn markdown(&self, h: &Header) -> String {
        let mut out = String::new();
        for l in h.lines() {
            let _ = writeln!(out, "- {}", l.replace('|', "\\|"));
        }
        out.push('\n');
        let rows = self.rows();
        let titles = self.titles();
        let _ = writeln!(out, "| {} |", titles.join(" | "));
        let _ = writeln!(
            out,
            "|{}",
            titles
                .iter()
                .enumerate()
                .map(|(i, _)| if i == 0 { " --- |" } else { " ---: |" })
                .collect::<String>()
        );
        for r in &rows {
            let _ = writeln!(out, "| {} |", self.cells(r).join(" | "));
        }
        for l in self.throughput_lines(&rows) {
            let _ = writeln!(out, "\n{l}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_medians() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_782_400 + 3_660), "2000-02-29 01:01 UTC");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(ratio(Some(1.0), Some(2.0)), "0.50");
        assert_eq!(ratio(Some(1.0), None), "–");
    }
}
