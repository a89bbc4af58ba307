//! The report as data: every part of `REPRODUCTION.md` is built as a [`Section`] (a title and its
//! [`Block`]s: text, tables, lists, figures, subsections) from the results, and [`to_markdown`] is the
//! one renderer that turns a section, or the whole report, into Markdown.
//!
//! Nothing here knows an experiment, a variant or how a number is formatted: the builders put finished
//! cell text in, and tests read the typed values back (a table's cells by column name, a list's items).
//! It depends on no other module of the crate, so the report and every post-training kind can use it.

/// A titled part of the report. Its subsections are [`Block::Section`]s, one heading level deeper.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Section {
    /// The heading's text.
    pub title: String,
    /// What follows the heading, in order.
    pub blocks: Vec<Block>,
}

impl Section {
    /// A section with no blocks yet.
    pub fn new(title: impl Into<String>) -> Self {
        Self { title: title.into(), blocks: Vec::new() }
    }

    /// Appends a block.
    pub fn push(&mut self, block: impl Into<Block>) {
        self.blocks.push(block.into());
    }

    /// The tables among its own blocks (not its subsections'), in order.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.blocks.iter().filter_map(|b| if let Block::Table(t) = b { Some(t) } else { None })
    }

    /// The subsection titled `title`, if any (not searched recursively).
    pub fn subsection(&self, title: &str) -> Option<&Section> {
        self.blocks.iter().find_map(|b| if let Block::Section(s) = b { (s.title == title).then_some(s) } else { None })
    }
}

/// One piece of a section.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// Markdown text as written: a paragraph (or an experiment's README, several paragraphs).
    Text(String),
    /// A table.
    Table(Table),
    /// A bulleted list.
    List(Vec<Item>),
    /// A figure on its own line.
    Figure(Figure),
    /// Figures one per line, together as one paragraph (the attention maps).
    Gallery(Vec<Figure>),
    /// A subsection.
    Section(Section),
}

impl From<Table> for Block {
    fn from(t: Table) -> Self {
        Block::Table(t)
    }
}

impl From<Figure> for Block {
    fn from(f: Figure) -> Self {
        Block::Figure(f)
    }
}

impl From<Section> for Block {
    fn from(s: Section) -> Self {
        Block::Section(s)
    }
}

impl From<String> for Block {
    fn from(s: String) -> Self {
        Block::Text(s)
    }
}

impl From<&str> for Block {
    fn from(s: &str) -> Self {
        Block::Text(s.to_string())
    }
}

/// How a table column is aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text (`---`).
    Left,
    /// Numbers (`---:`).
    Right,
}

/// A table: a header, each column's alignment, and rows of finished cell text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// Column headers.
    pub header: Vec<String>,
    /// Each column's alignment (as long as `header`).
    pub align: Vec<Align>,
    /// The rows, each as long as `header`.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns (header, alignment) and no rows.
    pub fn new<S: Into<String>>(columns: impl IntoIterator<Item = (S, Align)>) -> Self {
        let mut t = Table::default();
        for (h, a) in columns {
            t.column(h, a);
        }
        t
    }

    /// Adds a column (before any row is added).
    pub fn column(&mut self, header: impl Into<String>, align: Align) {
        self.header.push(header.into());
        self.align.push(align);
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The cell of row `row` in the column headed `header`.
    pub fn cell(&self, row: usize, header: &str) -> Option<&str> {
        let col = self.header.iter().position(|h| h == header)?;
        self.rows.get(row)?.get(col).map(String::as_str)
    }

    /// Every cell of the column headed `header`, top to bottom.
    pub fn column_cells(&self, header: &str) -> Vec<&str> {
        (0..self.rows.len()).filter_map(|i| self.cell(i, header)).collect()
    }
}

/// An item of a [`Block::List`], with its sub-items (one level).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Item {
    /// The item's text.
    pub text: String,
    /// Sub-items under it.
    pub sub: Vec<String>,
}

impl From<String> for Item {
    fn from(text: String) -> Self {
        Item { text, sub: Vec::new() }
    }
}

/// A figure: an image, with a link to its vector version when it has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// The image's alternative text.
    pub alt: String,
    /// The image, relative to the report.
    pub path: String,
    /// Its SVG, relative to the report, if drawn.
    pub svg: Option<String>,
}

impl Figure {
    /// A figure drawn as `<name>.png` and `<name>.svg` in the figures directory, `rel` relative to the
    /// report.
    pub fn drawn(alt: impl Into<String>, rel: &str, name: &str) -> Self {
        Figure { alt: alt.into(), path: format!("{rel}/{name}.png"), svg: Some(format!("{rel}/{name}.svg")) }
    }
}

/// Renders `section` as Markdown, its heading at `level` (1: `#`), each subsection one level deeper.
///
/// Every block is followed by one blank line, and the text ends with one newline. A table cell's `|`
/// is written as `/` (it would end the cell). The renderer adds nothing else: every word is the
/// builders'.
pub fn to_markdown(section: &Section, level: usize) -> String {
    let mut out = String::new();
    write_section(&mut out, section, level.max(1));
    out.truncate(out.trim_end_matches('\n').len());
    out.push('\n');
    out
}

fn write_section(out: &mut String, s: &Section, level: usize) {
    out.push_str(&"#".repeat(level));
    out.push(' ');
    out.push_str(&s.title);
    out.push_str("\n\n");
    for b in &s.blocks {
        match b {
            Block::Section(sub) => write_section(out, sub, level + 1),
            Block::Text(t) => out.push_str(t),
            Block::Table(t) => write_table(out, t),
            Block::List(items) => {
                let mut lines = Vec::new();
                for i in items {
                    lines.push(format!("- {}", i.text));
                    lines.extend(i.sub.iter().map(|s| format!("  - {s}")));
                }
                out.push_str(&lines.join("\n"));
            }
            Block::Figure(f) => out.push_str(&figure(f)),
            Block::Gallery(fs) => out.push_str(&fs.iter().map(figure).collect::<Vec<_>>().join("\n")),
        }
        if !matches!(b, Block::Section(_)) {
            out.push_str("\n\n");
        }
    }
}

fn figure(f: &Figure) -> String {
    let svg = f.svg.as_ref().map_or(String::new(), |s| format!(" ([SVG]({s}))"));
    format!("![{}]({}){svg}", f.alt, f.path)
}

fn write_table(out: &mut String, t: &Table) {
    let line = |cells: &mut dyn Iterator<Item = String>| format!("| {} |", cells.collect::<Vec<_>>().join(" | "));
    out.push_str(&line(&mut t.header.iter().map(|h| h.replace('|', "/"))));
    out.push_str("\n|");
    for a in &t.align {
        out.push_str(if *a == Align::Right { "---:|" } else { "---|" });
    }
    for r in &t.rows {
        out.push('\n');
        out.push_str(&line(&mut r.iter().map(|c| c.replace('|', "/"))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_is_followed_by_one_blank_line_and_subsections_go_one_level_down() {
        let mut inner = Section::new("Inner");
        inner.push("Inside.");
        let mut t = Table::new([("row", Align::Left), ("1x", Align::Right)]);
        t.row(vec!["a | b".into(), "1.000".into()]);
        let mut s = Section::new("Outer");
        s.push("Some *text*.");
        s.push(t);
        s.push(Block::List(vec![Item { text: "one".into(), sub: vec!["under".into()] }, "two".to_string().into()]));
        s.push(inner);
        s.push(Figure::drawn("a figure", "figures", "f"));
        s.push(Block::Gallery(vec![
            Figure { alt: "m1".into(), path: "figures/m1.png".into(), svg: None },
            Figure { alt: "m2".into(), path: "figures/m2.png".into(), svg: None },
        ]));
        assert_eq!(
            to_markdown(&s, 2),
            "## Outer\n\nSome *text*.\n\n| row | 1x |\n|---|---:|\n| a / b | 1.000 |\n\n- one\n  - under\n- two\n\n\
             ### Inner\n\nInside.\n\n![a figure](figures/f.png) ([SVG](figures/f.svg))\n\n\
             ![m1](figures/m1.png)\n![m2](figures/m2.png)\n"
        );
        assert_eq!(s.tables().next().unwrap().cell(0, "1x"), Some("1.000"));
        assert_eq!(s.subsection("Inner").unwrap().blocks, [Block::Text("Inside.".into())]);
    }

    #[test]
    fn an_empty_cell_and_an_empty_text_keep_their_place() {
        let mut t = Table::new([("a", Align::Left), ("note", Align::Left)]);
        t.row(vec!["x".into(), String::new()]);
        let mut s = Section::new("T");
        s.push(String::new());
        s.push(t);
        assert_eq!(to_markdown(&s, 1), "# T\n\n\n\n| a | note |\n|---|---|\n| x |  |\n");
    }
}
