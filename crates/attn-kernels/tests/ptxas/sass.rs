//! The machine code (SASS) of an assembled kernel, read for one hazard that neither NVRTC's PTX
//! nor the emulator shows: a `wgmma` register operand that ptxas lets a loop overwrite.
//!
//! v8 held Q's fragments in registers across its key-tile loop as the A operand of `Q K^T`. ptxas
//! (CUDA 13.0) gave those registers to P after the first tile's product, so from the second key tile
//! on `Q K^T` read P: v8 failed on the H100 and the H200 at d = 64 from T = 65 on, and passed at
//! d = 128, where the allocation differed. The PTX was right (Q's virtual registers live across the
//! loop), and an empty or self-`mov` operand fence did not change ptxas's choice.

use std::path::{Path, PathBuf};

/// cuobjdump: `$LSSA_CUOBJDUMP`, else the one Triton ships in the torch venv beside `torch/bin/ptxas`
/// (`site-packages/triton/backends/nvidia/bin`), else the CUDA toolkit's.
pub fn cuobjdump(ptxas: &Path) -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("LSSA_CUOBJDUMP") {
        c.push(p.into());
    }
    if let Some(site) = ptxas.parent().and_then(Path::parent).and_then(Path::parent) {
        c.push(site.join("triton/backends/nvidia/bin/cuobjdump"));
    }
    c.push("/usr/local/cuda/bin/cuobjdump".into());
    c.into_iter().find(|p| p.is_file())
}

/// One instruction: its address and its text without the predicate guard (`@P0`, `@!UP1`).
struct Instr {
    addr: u64,
    text: String,
}

fn parse(sass: &str) -> Vec<Instr> {
    sass.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix("/*")?;
            let (addr, rest) = rest.split_once("*/")?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            let text = rest.trim().split(';').next()?.trim();
            let text = match text.strip_prefix('@') {
                Some(guarded) => guarded.split_once(' ').map_or("", |(_, t)| t.trim()),
                None => text,
            };
            Some(Instr { addr, text: text.to_string() })
        })
        .collect()
}

/// The registers `Rn..Rn+count` named by an operand `Rn` (none for `RZ` or anything else).
fn regs(operand: &str, count: u32) -> Vec<u32> {
    match operand.trim().strip_prefix('R').and_then(|n| n.parse::<u32>().ok()) {
        Some(n) => (n..n + count).collect(),
        None => Vec::new(),
    }
}

/// The registers an instruction writes: its first operand, for the instructions that have a
/// register destination (stores, barriers, branches and `wgmma`s themselves have none that matters
/// here), widened by a `.64` / `.128` width.
fn written(text: &str) -> Vec<u32> {
    let (op, args) = text.split_once(' ').unwrap_or((text, ""));
    const NO_DEST: [&str; 14] = [
        "HGMMA",
        "ST",
        "RED",
        "ATOM",
        "BRA",
        "BAR",
        "WARPGROUP",
        "EXIT",
        "DEPBAR",
        "LDGSTS",
        "FENCE",
        "NOP",
        "RET",
        "CALL",
    ];
    if NO_DEST.iter().any(|p| op.starts_with(p)) {
        return Vec::new();
    }
    let width = if op.contains(".128") {
        4
    } else if op.contains(".64") {
        2
    } else {
        1
    };
    regs(args.split(',').next().unwrap_or(""), width)
}

/// The A registers of a `wgmma` with A from registers (`HGMMA.. Rd, Ra, gdesc[..], ..`).
fn hgmma_a(text: &str) -> Option<Vec<u32>> {
    let (op, args) = text.split_once(' ')?;
    if !op.starts_with("HGMMA") {
        return None;
    }
    let a = args.split(',').nth(1)?;
    let r = regs(a, 4);
    (!r.is_empty()).then_some(r)
}

/// Every `wgmma` inside a loop (a backward branch's range) whose A registers the loop writes only
/// after it: from the second trip on it reads what the previous trip left there, not the value it
/// read on the first (the loop-invariant operand was overwritten). One line per such `wgmma`, each
/// kernel of the dump (`Function : name`, addresses from 0 in each) on its own.
pub fn clobbered_loop_operands(sass: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut kernels = sass.split("Function : ");
    if let Some(head) = kernels.next() {
        found.extend(clobbered_in(head, ""));
    }
    for k in kernels {
        let name = k.lines().next().unwrap_or("").trim();
        found.extend(clobbered_in(k, name));
    }
    found
}

fn clobbered_in(sass: &str, kernel: &str) -> Vec<String> {
    let ins = parse(sass);
    let mut found = Vec::new();
    for (end, br) in ins.iter().enumerate() {
        let Some(target) =
            br.text.strip_prefix("BRA ").and_then(|t| u64::from_str_radix(t.trim().trim_start_matches("0x"), 16).ok())
        else {
            continue;
        };
        let Some(start) = ins.iter().position(|i| i.addr == target).filter(|_| target < br.addr) else {
            continue;
        };
        let body = &ins[start..=end];
        for (k, mma) in body.iter().enumerate() {
            let Some(a) = hgmma_a(&mma.text) else { continue };
            let writes =
                |range: &[Instr]| range.iter().find(|i| written(&i.text).iter().any(|r| a.contains(r))).map(|i| i.addr);
            if let (None, Some(later)) = (writes(&body[..k]), writes(&body[k + 1..])) {
                found.push(format!(
                    "{kernel}: loop {target:#x}-{:#x}: `{}` at {:#x} reads R{}.. that the loop overwrites only after it (at {later:#x})",
                    br.addr, mma.text, mma.addr, a[0]
                ));
            }
        }
    }
    found
}

/// Every register a warp names after it gave registers back with `setmaxnreg.dec` (SASS
/// `USETMAXREG.DEALLOC.CTAPOOL n`) beyond the `n` it kept, up to the region's unconditional `EXIT`
/// (v10's producer: 24 registers, the consumers taking the rest). A register past the budget is
/// not the warp's any more on the hardware; ptxas is expected to allocate within it. One line per
/// instruction that names one, each kernel of the dump on its own.
pub fn registers_past_dealloc(sass: &str) -> Vec<String> {
    let mut found = Vec::new();
    for k in sass.split("Function : ").skip(1) {
        let name = k.lines().next().unwrap_or("").trim();
        let mut budget: Option<u32> = None;
        for l in k.lines() {
            let Some(text) = l.trim_start().strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, t)| t) else {
                continue;
            };
            let text = text.trim().split(';').next().unwrap_or("").trim();
            if let Some(n) = text.strip_prefix("USETMAXREG.DEALLOC.CTAPOOL ") {
                budget = u32::from_str_radix(n.trim().trim_start_matches("0x"), 16).ok();
                continue;
            }
            let Some(n) = budget else { continue };
            if text == "EXIT" {
                budget = None;
                continue;
            }
            let over: Vec<u32> = text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter_map(|w| w.strip_prefix('R').and_then(|d| d.parse::<u32>().ok()))
                .filter(|&r| r >= n)
                .collect();
            if !over.is_empty() {
                found.push(format!("{name}: `{text}` names R{} after setmaxnreg.dec to {n}", over[0]));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOP: &str = "        /*0100*/                   LDSM.16.M88.4 R180, [R3] ;
        /*0110*/                   WARPGROUP.ARRIVE ;
        /*0120*/                   HGMMA.64x64x16.F32.BF16 R56, R180, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0130*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0140*/                   F2FP.BF16.F32.PACK_AB R180, R57, R56 ;
        /*0150*/                   HGMMA.64x64x16.F32.BF16 R88, R180, gdesc[UR12].tnspB, R88, gsb0 ;
        /*0160*/              @!P5 BRA 0x110 ;";

    #[test]
    fn a_register_past_a_warps_setmaxnreg_dec_is_found() {
        let producer = "Function : k
        /*0100*/                   USETMAXREG.DEALLOC.CTAPOOL 0x18 ;
        /*0110*/               @P0 EXIT ;
        /*0120*/                   IMAD.MOV.U32 R4, RZ, RZ, 0x4000 ;
        /*0130*/                   SYNCS.ARRIVE.TRANS64 RZ, [UR9], R4 ;
        /*0140*/                   EXIT ;
        /*0150*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R52+URZ], R31 ;";
        // Within 24 registers up to its EXIT; what follows (other warps' code) is not counted, nor
        // are uniform registers (UR9) or RZ.
        assert!(registers_past_dealloc(producer).is_empty());
        let over = registers_past_dealloc(&producer.replace("R4, RZ, RZ", "R24, RZ, RZ"));
        assert_eq!(over.len(), 1, "{over:?}");
        assert!(
            over[0].starts_with("k: `IMAD.MOV.U32 R24") && over[0].ends_with("names R24 after setmaxnreg.dec to 24")
        );
    }

    #[test]
    fn each_kernel_of_a_dump_is_read_on_its_own() {
        // Two kernels, each from address 0: the second's loop must not reach into the first.
        let two = format!("Function : a\n{LOOP}\nFunction : b\n{LOOP}");
        let found = clobbered_loop_operands(&two);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("a: ") && found[1].starts_with("b: "), "{found:?}");
    }

    #[test]
    fn a_register_operand_overwritten_later_in_its_loop_is_found() {
        // The first product reads Q's R180 (loaded before the loop), the loop then packs P into it.
        let found = clobbered_loop_operands(LOOP);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("at 0x120 reads R180") && found[0].ends_with("(at 0x140)"), "{found:?}");
        // P's product reads R180 after the loop wrote it in the same trip: fine.
        // With Q kept elsewhere, nothing is found; a predicated write counts as a write.
        assert!(
            clobbered_loop_operands(&LOOP.replace("PACK_AB R180", "PACK_AB R184").replace("R88, R180", "R88, R184"))
                .is_empty()
        );
        let guarded = LOOP.replace("F2FP.BF16.F32.PACK_AB R180", "@P1 F2FP.BF16.F32.PACK_AB R180");
        assert_eq!(clobbered_loop_operands(&guarded).len(), 1);
        // Wide loads write all their registers; outside any loop nothing is checked.
        assert_eq!(
            clobbered_loop_operands(&LOOP.replace("F2FP.BF16.F32.PACK_AB R180, R57, R56", "LDS.64 R179, [R2]")).len(),
            1
        );
        assert!(clobbered_loop_operands(&LOOP.replace("@!P5 BRA 0x110", "@!P5 BRA 0x170")).is_empty());
    }
}
