//! The recall mix ([`trainer::train::RecallMix`]): the share of windows it replaces, the sequences
//! it writes, and that a resumed source sees the same batches.

use trainer::data::recall::RecallTask;
use trainer::train::{BatchSource, MemorySource, RecallMix};

#[test]
fn the_mix_replaces_its_share_deterministically_and_resumes() {
    let tokens: Vec<u16> = (0..20_000u32).map(|i| (i % 1500) as u16).collect();
    let task = RecallTask::for_vocab(2048).unwrap();
    let run = |skip: usize, resume_from: Option<serde_json::Value>| {
        let mut src = MemorySource::new(tokens.clone(), 8, 32, 0, 1, "t").unwrap();
        let mut mix = RecallMix::new(&mut src, task.clone(), 0.25, 32, 7).unwrap();
        if let Some(p) = resume_from {
            mix.seek(&p).unwrap();
        }
        let mut out = Vec::new();
        for _ in 0..skip {
            mix.next_batch().unwrap();
        }
        let pos = mix.position();
        for _ in 0..10 {
            out.push(mix.next_batch().unwrap());
        }
        (out, pos)
    };
    let (all, _) = run(0, None);
    let mut replaced = 0;
    for (x, y) in &all {
        for row in 0..8 {
            let (xr, yr) = (&x[row * 32..(row + 1) * 32], &y[row * 32..(row + 1) * 32]);
            assert_eq!(&xr[1..], &yr[..31], "y is x shifted by one");
            let w: Vec<u32> = xr.iter().chain(&yr[31..]).map(|&v| v as u32).collect();
            if w.iter().any(|t| task.asks.contains(t)) {
                replaced += 1;
                assert!(task.questions(&w).iter().all(|(_, e, g)| e == g));
            }
        }
    }
    // 80 windows at a share of 0.25: 20 expected; a binomial sd of about 3.9.
    assert!((8..=32).contains(&replaced), "{replaced} of 80 windows replaced");
    // Resuming from the position after 4 batches gives the same next 6 batches.
    let (first, pos) = run(4, None);
    let (again, _) = run(0, Some(pos));
    assert_eq!(&first[..6], &again[..6]);
    assert_eq!(&all[4..], &first[..6]);
}
