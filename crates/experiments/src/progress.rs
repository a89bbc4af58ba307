//! What a person watching a reproduction sees. On a terminal: an overall bar (runs done, time left)
//! with one bar per running training (step, loss, tokens/s, time left) and the log lines above them.
//! Otherwise (a log file, a CI job): plain lines only, one per tenth of each training, so the log
//! stays readable and a long run is never silent.

use std::io::IsTerminal as _;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use trainer::train::StepMetrics;

/// The bars of this process, when stderr is a terminal.
fn bars() -> Option<&'static MultiProgress> {
    static BARS: OnceLock<Option<MultiProgress>> = OnceLock::new();
    BARS.get_or_init(|| std::io::stderr().is_terminal().then(MultiProgress::new)).as_ref()
}

/// A line of the reproduction's log (stderr), printed above the bars on a terminal.
pub fn say(line: &str) {
    let line = format!("reproduce: {line}");
    match bars() {
        Some(b) => {
            let _ = b.println(line);
        }
        None => eprintln!("{line}"),
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).expect("a valid template").progress_chars("=> ")
}

/// The overall bar of `runs` trainings (a hidden one off a terminal, where the runner's
/// "[done/total]" lines say the same).
pub fn overall(runs: usize) -> ProgressBar {
    match bars() {
        Some(b) => {
            let bar = b.add(ProgressBar::new(runs as u64));
            bar.set_style(style("runs {pos}/{len} [{bar:30}] {elapsed_precise} elapsed, ~{eta} left"));
            bar
        }
        None => ProgressBar::hidden(),
    }
}

/// The progress of one training (and then of its evaluation).
pub struct Training {
    label: String,
    max_steps: usize,
    bar: Option<ProgressBar>,
    /// The first step seen in this process and when: the rate excludes steps done before a resume.
    first: Mutex<Option<(usize, Instant)>>,
}

impl Training {
    /// Starts showing the training `label` of `max_steps` steps.
    pub fn start(label: &str, max_steps: usize) -> Training {
        let bar = bars().map(|b| {
            let bar = b.add(ProgressBar::new(max_steps as u64));
            bar.set_style(style("{prefix:>24} [{bar:25}] step {pos}/{len} {msg}"));
            bar.set_prefix(label.to_string());
            bar
        });
        Training { label: label.to_string(), max_steps, bar, first: Mutex::new(None) }
    }

    /// Called after every optimiser step.
    pub fn step(&self, m: &StepMetrics) {
        let (first, since) = *self.first.lock().expect("progress").get_or_insert((m.step, Instant::now()));
        let left = if m.step > first {
            let per_step = since.elapsed().as_secs_f64() / (m.step - first) as f64;
            format!("{:.0} s", per_step * (self.max_steps - m.step) as f64)
        } else {
            "?".to_string()
        };
        let what = format!("loss {:.3}, {:.0} tok/s, ~{left} left", m.loss, m.tokens_per_s);
        match &self.bar {
            Some(bar) => {
                bar.set_position(m.step as u64);
                bar.set_message(what);
            }
            None => {
                let every = (self.max_steps / 10).max(1);
                if m.step == first || m.step.is_multiple_of(every) || m.step == self.max_steps {
                    say(&format!("{}: step {}/{}, {what}", self.label, m.step, self.max_steps));
                }
            }
        }
    }

    /// Says what the run does now that training is over (its evaluations, say).
    pub fn phase(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_string()),
            None => say(&format!("{}: {what}", self.label)),
        }
    }
}

impl Drop for Training {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Progress of a piece of work of `len` units (fine-tuning steps, prompts, task files): a bar on a
/// terminal, else a line at every tenth.
pub struct Work {
    label: String,
    len: usize,
    bar: Option<ProgressBar>,
    done: std::sync::atomic::AtomicUsize,
}

impl Work {
    /// Starts showing `label`, `len` units of `unit`.
    pub fn start(label: &str, len: usize, unit: &str) -> Work {
        let bar = bars().map(|b| {
            let bar = b.add(ProgressBar::new(len as u64));
            bar.set_style(style(&format!(
                "{{prefix:>24}} [{{bar:25}}] {{pos}}/{{len}} {unit} ({{elapsed}}, ~{{eta}} left)"
            )));
            bar.set_prefix(label.to_string());
            bar
        });
        if bar.is_none() {
            say(&format!("{label}: {len} {unit} ..."));
        }
        Work { label: label.to_string(), len, bar, done: std::sync::atomic::AtomicUsize::new(0) }
    }

    /// One more unit done.
    pub fn inc(&self) {
        let done = self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        match &self.bar {
            Some(bar) => bar.set_position(done as u64),
            None => {
                let every = (self.len / 10).max(1);
                if done.is_multiple_of(every) && done < self.len {
                    say(&format!("{}: {done}/{}", self.label, self.len));
                }
            }
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
