//! The transcript of a run: everything `say!` printed, for the Markdown copy of the results.

/// Everything printed, for the Markdown copy of the results.
pub(crate) static LOG: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// `println!` that also keeps the line for the Markdown report.
macro_rules! say {
    ($($t:tt)*) => {{
        let line = format!($($t)*);
        println!("{line}");
        let mut log = $crate::transcript::LOG.lock().unwrap_or_else(|e| e.into_inner());
        log.push_str(&line);
        log.push('\n');
    }};
}

pub(crate) use say;
