//! A small JSON reader for cargo's `--message-format=json` lines (xtask depends on std and anyhow
//! only, so that it builds in seconds on a fresh machine).

use anyhow::{Result, bail};

/// A JSON value; objects keep their keys in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// The value at `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        if let Json::Str(s) = self { Some(s) } else { None }
    }

    pub fn as_f64(&self) -> Option<f64> {
        if let Json::Num(x) = self { Some(*x) } else { None }
    }

    pub fn as_bool(&self) -> Option<bool> {
        if let Json::Bool(b) = self { Some(*b) } else { None }
    }

    pub fn as_array(&self) -> Option<&[Json]> {
        if let Json::Arr(a) = self { Some(a) } else { None }
    }
}

/// Parses one JSON document.
pub fn parse(text: &str) -> Result<Json> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    let v = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        bail!("JSON: trailing characters at byte {}", p.i);
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> Result<()> {
        if !self.s[self.i..].starts_with(lit.as_bytes()) {
            bail!("JSON: expected `{lit}` at byte {}", self.i);
        }
        self.i += lit.len();
        Ok(())
    }

    fn value(&mut self) -> Result<Json> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    self.eat(":")?;
                    fields.push((key, self.value()?));
                    self.ws();
                    if self.s.get(self.i) == Some(&b',') {
                        self.i += 1;
                    } else {
                        self.eat("}")?;
                        return Ok(Json::Obj(fields));
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    if self.s.get(self.i) == Some(&b',') {
                        self.i += 1;
                    } else {
                        self.eat("]")?;
                        return Ok(Json::Arr(items));
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.eat("true").map(|_| Json::Bool(true)),
            Some(b'f') => self.eat("false").map(|_| Json::Bool(false)),
            Some(b'n') => self.eat("null").map(|_| Json::Null),
            Some(_) => {
                let start = self.i;
                while self.i < self.s.len() && matches!(self.s[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    self.i += 1;
                }
                let num = std::str::from_utf8(&self.s[start..self.i])?;
                match num.parse() {
                    Ok(x) => Ok(Json::Num(x)),
                    Err(_) => bail!("JSON: not a value at byte {start}"),
                }
            }
            None => bail!("JSON: unexpected end"),
        }
    }

    fn string(&mut self) -> Result<String> {
        self.eat("\"")?;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else { bail!("JSON: unterminated string") };
            self.i += 1;
            match c {
                b'"' => return Ok(String::from_utf8(out)?),
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else { bail!("JSON: unterminated escape") };
                    self.i += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let hex = std::str::from_utf8(self.s.get(self.i..self.i + 4).unwrap_or_default())?;
                            self.i += 4;
                            let mut code = u32::from_str_radix(hex, 16)?;
                            // A surrogate pair: the low half follows as another \u escape.
                            if (0xD800..0xDC00).contains(&code) && self.s[self.i..].starts_with(b"\\u") {
                                let low =
                                    u32::from_str_radix(std::str::from_utf8(&self.s[self.i + 2..self.i + 6])?, 16)?;
                                self.i += 6;
                                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                            }
                            let ch = char::from_u32(code).unwrap_or('\u{FFFD}');
                            out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                        }
                        other => out.push(other), // \" \\ \/
                    }
                }
                _ => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Json, parse};

    #[test]
    fn reads_what_cargo_writes() {
        let v = parse(r#"{"reason":"compiler-message","message":{"level":"error","spans":[{"byte_start":12,"is_primary":true,"suggested_replacement":",\n    A::B => todo!()","label":null}],"code":{"code":"E0004"},"x":-1.5e2,"u":"\u00e9\ud83d\ude00"}}"#).unwrap();
        let m = v.get("message").unwrap();
        assert_eq!(m.get("level").and_then(Json::as_str), Some("error"));
        assert_eq!(m.get("code").and_then(|c| c.get("code")).and_then(Json::as_str), Some("E0004"));
        let span = &m.get("spans").and_then(Json::as_array).unwrap()[0];
        assert_eq!(span.get("byte_start").and_then(Json::as_f64), Some(12.0));
        assert_eq!(span.get("is_primary").and_then(Json::as_bool), Some(true));
        assert_eq!(span.get("suggested_replacement").and_then(Json::as_str), Some(",\n    A::B => todo!()"));
        assert_eq!(span.get("label"), Some(&Json::Null));
        assert_eq!(m.get("x").and_then(Json::as_f64), Some(-150.0));
        assert_eq!(m.get("u").and_then(Json::as_str), Some("é😀"));
    }

    #[test]
    fn refuses_what_is_not_json() {
        for bad in ["{", r#"{"a" 1}"#, "[1,]", r#""open"#, "{} x", "nul"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
