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

/// A bar labelled `label` of `len` units under this process's bars (none off a terminal), cleared
/// when dropped.
struct Bar(Option<ProgressBar>);

impl Bar {
    fn new(label: &str, len: usize, template: &str) -> Bar {
        Bar(bars().map(|b| {
            let bar = b.add(ProgressBar::new(len as u64));
            bar.set_style(style(template));
            bar.set_prefix(label.to_string());
            bar
        }))
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// Whether the `done`-th of `len` units gets a plain log line: every tenth.
fn at_a_tenth(done: usize, len: usize) -> bool {
    done.is_multiple_of((len / 10).max(1))
}

/// The progress of one training (and then of its evaluation).
pub struct Training {
    label: String,
    max_steps: usize,
    bar: Bar,
    /// The first step seen in this process and when: the rate excludes steps done before a resume.
    first: Mutex<Option<(usize, Instant)>>,
}

impl Training {
    /// Starts showing the training `label` of `max_steps` steps.
    pub fn start(label: &str, max_steps: usize) -> Training {
        let bar = Bar::new(label, max_steps, "{prefix:>24} [{bar:25}] step {pos}/{len} {msg}");
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
        match &self.bar.0 {
            Some(bar) => {
                bar.set_position(m.step as u64);
                bar.set_message(what);
            }
            None => {
                if m.step == first || at_a_tenth(m.step, self.max_steps) || m.step == self.max_steps {
                    say(&format!("{}: step {}/{}, {what}", self.label, m.step, self.max_steps));
                }
            }
        }
    }

    /// Says what the run does now that training is over (its evaluations, say).
    pub fn phase(&self, what: &str) {
        match &self.bar.0 {
            Some(bar) => bar.set_message(what.to_string()),
            None => say(&format!("{}: {what}", self.label)),
        }
    }
}

/// Progress of a piece of work of `len` units (fine-tuning steps, prompts, task files): a bar on a
/// terminal, else a line at every tenth.
pub struct Work {
    label: String,
    len: usize,
    bar: Bar,
    done: std::sync::atomic::AtomicUsize,
}

impl Work {
    /// Starts showing `label`, `len` units of `unit`.
    pub fn start(label: &str, len: usize, unit: &str) -> Work {
        let bar = Bar::new(
            label,
            len,
            &format!("{{prefix:>24}} [{{bar:25}}] {{pos}}/{{len}} {unit} ({{elapsed}}, ~{{eta}} left)"),
        );
        if bar.0.is_none() {
            say(&format!("{label}: {len} {unit} ..."));
        }
        Work { label: label.to_string(), len, bar, done: std::sync::atomic::AtomicUsize::new(0) }
    }

    /// One more unit done.
    pub fn inc(&self) {
        let done = self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        match &self.bar.0 {
            Some(bar) => bar.set_position(done as u64),
            None => {
                if at_a_tenth(done, self.len) && done < self.len {
                    say(&format!("{}: {done}/{}", self.label, self.len));
                }
            }
        }
    }
}
