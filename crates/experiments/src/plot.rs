//! The report's figures (plotters): curves against length on a log2 axis, gaps with intervals,
//! heat maps and attention maps. Knows no experiment: every function takes plain numbers.

use std::path::Path;

use anyhow::{Context as _, Result};
use plotters::prelude::*;

pub(crate) const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Series of a plot: label, colour index, dashed, points.
pub(crate) type Series = (String, usize, bool, Vec<(f64, f64)>);

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let pts = series.iter().flat_map(|s| s.3.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (1.0, 16.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.08).max(0.01);
    let (y0, y1) = (y0 - pad, y1 + pad);
    let (lx0, lx1) = (x0.log2(), x1.log2().max(x0.log2() + 1.0));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(lx0..lx1, y0..y1)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_labels(((lx1 - lx0).ceil() as usize + 1).max(2))
        .y_desc(y_label)
        .x_label_formatter(&|v| format!("{:.0}", 2f64.powf(*v))) // log2 axis, labelled in the original units
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for (label, c, dashed, points) in series {
        let color = COLORS[c % COLORS.len()];
        let data: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x.log2(), y)).collect();
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: 2 };
        if *dashed {
            chart
                .draw_series(DashedLineSeries::new(data.clone(), 6, 4, style))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        } else {
            chart
                .draw_series(LineSeries::new(data.clone(), style))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        chart
            .draw_series(data.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// Draws `series` (x on a log2 axis) to `<path>.png` and `<path>.svg`.
pub(crate) fn save(path_no_ext: &Path, title: &str, x_label: &str, series: &[Series]) -> Result<()> {
    save_with(path_no_ext, title, (x_label, "validation loss (nats/token)"), series)
}

pub(crate) fn save_with(path_no_ext: &Path, title: &str, labels: (&str, &str), series: &[Series]) -> Result<()> {
    let png = path_no_ext.with_extension("png");
    let svg = path_no_ext.with_extension("svg");
    draw(BitMapBackend::new(&png, (900, 560)).into_drawing_area(), title, labels, series)
        .with_context(|| format!("drawing {}", png.display()))?;
    draw(SVGBackend::new(&svg, (900, 560)).into_drawing_area(), title, labels, series)
        .with_context(|| format!("drawing {}", svg.display()))?;
    Ok(())
}

/// Draws an attention map (rows = queries, columns = keys) as a PNG of at most 512 x 512 pixels:
/// each row divided by its maximum, a pixel the largest value of the block it covers, white (0) to
/// black (1) on a square-root scale so that small weights stay visible.
pub fn draw_map(path: &Path, title: &str, map: &[Vec<f32>]) -> Result<()> {
    let n = map.len();
    anyhow::ensure!(n > 0 && map.iter().all(|r| r.len() == n), "an attention map must be square and non-empty");
    let side = n.min(512);
    let block = n.div_ceil(side);
    let cells = n.div_ceil(block);
    let mut shade = vec![0f32; cells * cells];
    for (i, row) in map.iter().enumerate() {
        let max = row.iter().copied().fold(0f32, f32::max);
        if max <= 0.0 {
            continue;
        }
        for (j, w) in row.iter().enumerate() {
            let cell = &mut shade[(i / block) * cells + j / block];
            *cell = cell.max((w / max).clamp(0.0, 1.0).sqrt());
        }
    }
    let (w, h) = (cells as u32 * 2 + 20, cells as u32 * 2 + 50);
    let root = BitMapBackend::new(path, (w.max(300), h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.draw(&Text::new(title.to_string(), (10, 10), ("sans-serif", 14))).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for r in 0..cells {
        for c in 0..cells {
            let v = (255.0 * (1.0 - shade[r * cells + c])) as u8;
            let (x, y) = (10 + 2 * c as i32, 40 + 2 * r as i32);
            root.draw(&Rectangle::new([(x, y), (x + 2, y + 2)], RGBColor(v, v, v).filled()))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }
    }
    root.present().map_err(|e| anyhow::anyhow!("drawing {}: {e:?}", path.display()))?;
    Ok(())
}

/// Series of a gap plot: label, colour index, dashed, `(x, interval)` points.
pub(crate) type GapSeries = (String, usize, bool, Vec<(f64, crate::stats::Interval)>);

/// Draws gap series with their intervals, x on a log2 axis; see [`save_gaps`].
fn draw_gaps<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    zero_line: bool,
    series: &[GapSeries],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{x:?}");
    root.fill(&WHITE).map_err(e)?;
    let all = series.iter().flat_map(|s| s.3.iter());
    // A gap figure keeps 0 (no difference) in view; other figures fit their data.
    let (mut y0, mut y1, mut x1) =
        if zero_line { (0f64, 0f64, 2f64) } else { (f64::INFINITY, f64::NEG_INFINITY, 2f64) };
    for (x, i) in all {
        y0 = y0.min(i.lo);
        y1 = y1.max(i.hi);
        x1 = x1.max(*x);
    }
    let pad = ((y1 - y0) * 0.08).max(0.005);
    // Series of one row are offset a little along x so their intervals do not hide each other.
    let nudge = |s: usize, dashed: bool| 0.04 * (s as f64 - 1.0) + if dashed { 0.02 } else { -0.02 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3f64..x1.log2() + 0.3, (y0 - pad)..(y1 + pad))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels((x1.log2() as usize + 1).max(2))
        .x_label_formatter(&|v| format!("{:.0}", 2f64.powf(v.round())))
        .draw()
        .map_err(e)?;
    if zero_line {
        chart.draw_series(LineSeries::new([(-0.3, 0.0), (x1.log2() + 0.3, 0.0)], BLACK.mix(0.4))).map_err(e)?;
    }
    for (label, c, dashed, pts) in series {
        let color = COLORS[c % COLORS.len()];
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: 2 };
        let xy: Vec<(f64, f64)> = pts.iter().map(|(x, i)| (x.log2() + nudge(*c, *dashed), i.estimate)).collect();
        let drawn = if *dashed {
            chart.draw_series(DashedLineSeries::new(xy.clone(), 6, 4, style)).map_err(e)?
        } else {
            chart.draw_series(LineSeries::new(xy.clone(), style)).map_err(e)?
        };
        drawn.label(label.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        chart
            .draw_series(
                pts.iter()
                    .zip(&xy)
                    .map(|((_, i), &(x, y))| ErrorBar::new_vertical(x, i.lo, y, i.hi, color.filled(), 6)),
            )
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(if zero_line { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::LowerLeft })
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Draws `series` (gaps with 95% intervals against length) to `<path>.png` and `<path>.svg`.
pub(crate) fn save_gaps(path_no_ext: &Path, title: &str, series: &[GapSeries]) -> Result<()> {
    save_intervals(
        path_no_ext,
        title,
        ("inference length / training length", "loss minus softmax's (nats/token)"),
        true,
        series,
    )
}

/// Draws `series` (estimates with 95% intervals against a length multiple, on a log2 axis) to
/// `<path>.png` and `<path>.svg`, with axis `labels` (x, y); `zero_line` keeps 0 in view and draws it.
pub(crate) fn save_intervals(
    path_no_ext: &Path,
    title: &str,
    labels: (&str, &str),
    zero_line: bool,
    series: &[GapSeries],
) -> Result<()> {
    let png = path_no_ext.with_extension("png");
    let svg = path_no_ext.with_extension("svg");
    draw_gaps(BitMapBackend::new(&png, (900, 560)).into_drawing_area(), title, labels, zero_line, series)
        .with_context(|| format!("drawing {}", png.display()))?;
    draw_gaps(SVGBackend::new(&svg, (900, 560)).into_drawing_area(), title, labels, zero_line, series)
        .with_context(|| format!("drawing {}", svg.display()))?;
    Ok(())
}
