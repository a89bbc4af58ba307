//! The emulator's view of a CUDA source: which lines its C++ build compiles (`LSSA_EMU` defined),
//! read from the preprocessor groups around them, for the tidy check that hides inline PTX from the
//! emulator.

/// A preprocessor condition: `defined(NAME)`, another atom (`DTYPE == 1`, `HAVE_WGMMA`) taken as an
/// unknown boolean, or their combinations.
#[derive(Clone, Debug)]
enum Cond {
    Atom(String),
    Not(Box<Cond>),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
}

impl Cond {
    fn parse(text: &str) -> Cond {
        let mut toks = Vec::new();
        let mut atom = String::new();
        let flush = |atom: &mut String, toks: &mut Vec<String>| {
            if !atom.trim().is_empty() {
                toks.push(atom.split_whitespace().collect::<Vec<_>>().join(" "));
            }
            atom.clear();
        };
        let cs: Vec<char> = text.split("//").next().unwrap_or("").chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let rest: String = cs[i..].iter().collect();
            if let Some(r) = rest.strip_prefix("defined") {
                let name: String =
                    r.trim_start_matches([' ', '(']).chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let used = r.find(name.as_str()).unwrap_or(0) + name.len();
                let used = used + r[used..].chars().take_while(|c| *c == ')' || *c == ' ').count().min(1);
                flush(&mut atom, &mut toks);
                toks.push(format!("defined({name})"));
                i += "defined".len() + r[..used].chars().count();
                continue;
            }
            let two = &rest[..rest.len().min(2)];
            if two == "&&" || two == "||" {
                flush(&mut atom, &mut toks);
                toks.push(two.to_string());
                i += 2;
            } else if cs[i] == '(' || cs[i] == ')' || (cs[i] == '!' && cs.get(i + 1) != Some(&'=')) {
                flush(&mut atom, &mut toks);
                toks.push(cs[i].to_string());
                i += 1;
            } else {
                atom.push(cs[i]);
                i += 1;
            }
        }
        flush(&mut atom, &mut toks);
        let mut pos = 0;
        Self::or(&toks, &mut pos)
    }

    fn or(t: &[String], pos: &mut usize) -> Cond {
        let mut c = Self::and(t, pos);
        while t.get(*pos).is_some_and(|x| x == "||") {
            *pos += 1;
            c = Cond::Or(Box::new(c), Box::new(Self::and(t, pos)));
        }
        c
    }

    fn and(t: &[String], pos: &mut usize) -> Cond {
        let mut c = Self::unary(t, pos);
        while t.get(*pos).is_some_and(|x| x == "&&") {
            *pos += 1;
            c = Cond::And(Box::new(c), Box::new(Self::unary(t, pos)));
        }
        c
    }

    fn unary(t: &[String], pos: &mut usize) -> Cond {
        let tok = t.get(*pos).cloned().unwrap_or_default();
        *pos += 1;
        match tok.as_str() {
            "!" => Cond::Not(Box::new(Self::unary(t, pos))),
            "(" => {
                let c = Self::or(t, pos);
                *pos += 1; // ")"
                c
            }
            _ => Cond::Atom(tok),
        }
    }

    fn atoms(&self, out: &mut Vec<String>) {
        match self {
            Cond::Atom(a) if a != "defined(LSSA_EMU)" && !out.contains(a) => out.push(a.clone()),
            Cond::Atom(_) => {}
            Cond::Not(c) => c.atoms(out),
            Cond::And(a, b) | Cond::Or(a, b) => {
                a.atoms(out);
                b.atoms(out);
            }
        }
    }

    /// The value with `LSSA_EMU` defined and the other atoms as `truth` says.
    fn eval(&self, truth: &dyn Fn(&str) -> bool) -> bool {
        match self {
            Cond::Atom(a) if a == "defined(LSSA_EMU)" => true,
            Cond::Atom(a) => truth(a),
            Cond::Not(c) => !c.eval(truth),
            Cond::And(a, b) => a.eval(truth) && b.eval(truth),
            Cond::Or(a, b) => a.eval(truth) || b.eval(truth),
        }
    }
}

/// Whether each line of a CUDA source can be compiled in the emulator's build (`LSSA_EMU` defined):
/// some value of the other conditions' atoms (each an unknown boolean) selects every branch around it.
pub fn emu_compiled_lines(text: &str) -> Vec<bool> {
    // Per open group: the conditions of its earlier branches, and that of the current one.
    let mut groups: Vec<(Vec<Cond>, Cond)> = Vec::new();
    let always = Cond::Atom("defined(LSSA_EMU)".into());
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(d) = t.strip_prefix('#').map(str::trim_start) {
            let (word, rest) = d.split_once(char::is_whitespace).unwrap_or((d, ""));
            match word {
                "if" => groups.push((Vec::new(), Cond::parse(rest))),
                "ifdef" => groups.push((Vec::new(), Cond::parse(&format!("defined({})", rest.trim())))),
                "ifndef" => groups.push((Vec::new(), Cond::parse(&format!("!defined({})", rest.trim())))),
                "elif" | "else" => {
                    if let Some((before, cur)) = groups.last_mut() {
                        let next = if word == "elif" { Cond::parse(rest) } else { always.clone() };
                        before.push(std::mem::replace(cur, next));
                    }
                }
                "endif" => {
                    groups.pop();
                }
                _ => {}
            }
        }
        let mut atoms = Vec::new();
        for (before, cur) in &groups {
            before.iter().chain([cur]).for_each(|c| c.atoms(&mut atoms));
        }
        let reachable = (0u64..1 << atoms.len().min(16)).any(|bits| {
            let truth = |a: &str| atoms.iter().position(|x| x == a).is_some_and(|i| bits >> i & 1 == 1);
            groups.iter().all(|(before, cur)| cur.eval(&truth) && before.iter().all(|c| !c.eval(&truth)))
        });
        out.push(reachable);
    }
    out
}
