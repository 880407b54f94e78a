//! Drawing one frame: a header (backend, age of the data, mode), a bar and a
//! history per GPU, the holders, the selected holder's reasons, and the
//! footer (a message, a free's progress or result, the keys). Plain marks
//! carry the meaning too (`#` used by a process, `!` held by no process), so
//! that it reads without colour (NO_COLOR, TERM=dumb).

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::App;
use super::model::{GpuBar, Row};
use crate::snapshot::UnattributedKind;
use crate::units::{Bytes, MaybeBytes, short};

const PALETTE: [Color; 5] = [
    Color::Cyan,
    Color::Green,
    Color::Yellow,
    Color::Blue,
    Color::Magenta,
];
const SPARK: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
const SPARK_ASCII: [char; 8] = ['_', '.', ':', '-', '=', '+', '*', '#'];

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let gpus = app.bars.len().max(1) as u16;
    let wrapped = |line: &String| {
        line.chars()
            .count()
            .div_ceil(area.width.max(1) as usize)
            .max(1)
    };
    let footer = 2 + app.footer_lines().iter().map(wrapped).sum::<usize>() as u16;
    let [header, bars, table, bottom] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(gpus.min(area.height / 3).max(1)),
        Constraint::Min(3),
        Constraint::Length(footer.min(area.height / 2)),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(app.header()), header);
    frame.render_widget(Paragraph::new(bar_lines(app, bars.width)), bars);
    frame.render_widget(Paragraph::new(table_lines(app, table)), table);
    frame.render_widget(
        Paragraph::new(bottom_lines(app)).wrap(Wrap { trim: false }),
        bottom,
    );
    if let Some(lines) = app.popup() {
        popup(frame, area, lines, app);
    }
}

fn style(app: &App, style: Style) -> Style {
    if app.color { style } else { Style::default() }
}

/// What a GPU is doing, after its memory: ` 87%  64°C  312/700W`, `?` for
/// a figure the driver did not say; empty where it said none of them.
fn activity_text(bar: &GpuBar, ascii: bool) -> String {
    if bar.utilization.is_none()
        && bar.temperature.is_none()
        && bar.power_watts.is_none()
        && bar.power_limit_watts.is_none()
    {
        return String::new();
    }
    let known =
        |value: Option<u32>, unit: &str| value.map_or("?".to_string(), |v| format!("{v}{unit}"));
    let watts = |value: Option<f64>| value.map_or("?".to_string(), |w| format!("{}", w.round()));
    format!(
        " {:>4} {:>5} {}/{}W",
        known(bar.utilization, "%"),
        known(bar.temperature, if ascii { "C" } else { "°C" }),
        watts(bar.power_watts),
        watts(bar.power_limit_watts)
    )
}

fn bar_lines(app: &App, width: u16) -> Vec<Line<'static>> {
    let spark_width = 12usize;
    let activity: Vec<String> = app
        .bars
        .iter()
        .map(|bar| activity_text(bar, app.ascii))
        .collect();
    let activity_width = activity
        .iter()
        .map(|text| text.chars().count())
        .max()
        .unwrap_or(0);
    let bar_width = (width as usize)
        .saturating_sub(6 + 22 + spark_width + 2 + activity_width)
        .max(8);
    app.bars
        .iter()
        .zip(activity)
        .map(|(bar, activity)| {
            let mut spans = vec![Span::raw(format!("GPU{:<2} ", bar.index))];
            if let Some(error) = &bar.error {
                spans.push(Span::styled(
                    format!("({error})"),
                    style(app, Style::default().fg(Color::Red)),
                ));
                return Line::from(spans);
            }
            spans.extend(bar_spans(app, bar, bar_width));
            spans.push(Span::raw(format!(
                " {:>9}/{:<9}{activity:<activity_width$}",
                MaybeBytes(bar.used).to_string(),
                MaybeBytes(bar.total).to_string()
            )));
            spans.push(Span::raw(format!(
                " {}",
                spark(app, bar.index, bar.total, spark_width)
            )));
            Line::from(spans)
        })
        .collect()
}

fn bar_spans(app: &App, bar: &GpuBar, width: usize) -> Vec<Span<'static>> {
    let total = bar.total.unwrap_or(0).max(1);
    let cells = |bytes: u64| -> usize {
        ((bytes as u128 * width as u128).div_ceil(total as u128) as usize).min(width)
    };
    let mut spans = vec![Span::raw("[")];
    let mut used = 0;
    for (pid, memory) in &bar.by_pid {
        let count = cells(*memory).min(width - used);
        used += count;
        let color = PALETTE[*pid as usize % PALETTE.len()];
        spans.push(Span::styled(
            "#".repeat(count),
            style(app, Style::default().fg(color)),
        ));
    }
    // Unseen from this PID namespace is not held by no process: its own
    // mark and colour, and the word.
    let unexplained =
        bar.no_process
            .filter(|(bytes, _)| *bytes > 0)
            .map(|(bytes, kind)| match kind {
                UnattributedKind::Unseen => (bytes, '?', Color::Magenta, " unseen"),
                _ => (bytes, '!', Color::Red, ""),
            });
    if let Some((bytes, mark, color, _)) = unexplained {
        let count = cells(bytes).min(width - used);
        used += count;
        spans.push(Span::styled(
            mark.to_string().repeat(count),
            style(app, Style::default().fg(color).add_modifier(Modifier::BOLD)),
        ));
    }
    spans.push(Span::raw(".".repeat(width - used)));
    spans.push(Span::raw("]"));
    // Said in words too: the figure that no listed process explains.
    if let Some((bytes, mark, color, word)) = unexplained {
        spans.push(Span::styled(
            format!(" {mark}{}{word}", Bytes(bytes)),
            style(app, Style::default().fg(color)),
        ));
    }
    spans
}

fn spark(app: &App, gpu: u32, total: Option<u64>, width: usize) -> String {
    let marks = if app.ascii { SPARK_ASCII } else { SPARK };
    let Some(samples) = app.history.used.get(&gpu) else {
        return String::new();
    };
    let total = total.unwrap_or(0).max(1);
    samples
        .iter()
        .skip(samples.len().saturating_sub(width))
        .map(|sample| match sample {
            Some(used) => marks[((*used as u128 * 7) / total as u128).min(7) as usize],
            None => '?',
        })
        .collect()
}

/// Which columns the holders' table has besides the fixed ones: CONTAINER
/// where some holder runs in one, SM% where the driver gives some holder's;
/// and how wide GPU is: its widest row, never cut (a cut `(0),(1)` says
/// something else), from `MIN_GPU_COLUMN` to `GPU_COLUMN` (then `…`).
#[derive(Clone, Copy)]
struct Columns {
    containers: bool,
    sm: bool,
    gpu: usize,
}

/// The narrowest and the widest the GPU column gets (sixteen GPUs, or
/// eight MIG instances).
const MIN_GPU_COLUMN: usize = 5;
const GPU_COLUMN: usize = 24;

fn row_text(row: &Row, tagged: bool, columns: Columns, width: usize) -> String {
    let indent = "  ".repeat(row.depth.min(6));
    let gpu_width = columns.gpu;
    let mut text = format!(
        "{}{:>7} {:<8.8} {:<1.1} {:<gpu_width$} {:>9} ",
        if tagged { '*' } else { ' ' },
        row.pid,
        row.user,
        row.state,
        short(&row.gpus, gpu_width),
        row.memory,
    );
    if columns.sm {
        let sm = row
            .sm
            .map_or("-".to_string(), |percent| format!("{percent}%"));
        text.push_str(&format!("{sm:>4} "));
    }
    text.push_str(&format!("{:<20.20} ", row.flags));
    if columns.containers {
        text.push_str(&format!("{:<14.14} ", row.container));
    }
    text.push_str(&indent);
    text.push_str(&row.command);
    text.chars().take(width).collect()
}

fn table_lines(app: &App, area: Rect) -> Vec<Line<'static>> {
    let columns = Columns {
        containers: app.rows.iter().any(|row| !row.container.is_empty()),
        sm: app.rows.iter().any(|row| row.sm.is_some()),
        gpu: app
            .rows
            .iter()
            .map(|row| row.gpus.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(MIN_GPU_COLUMN, GPU_COLUMN),
    };
    let gpu_width = columns.gpu;
    let mut header = format!(
        " {:>7} {:<8} {:<1} {:<gpu_width$} {:>9} ",
        "PID", "USER", "S", "GPU", "GPU MEM"
    );
    if columns.sm {
        header.push_str(&format!("{:>4} ", "SM%"));
    }
    header.push_str(&format!("{:<20} ", "FLAGS"));
    if columns.containers {
        header.push_str(&format!("{:<14} ", "CONTAINER"));
    }
    header.push_str("COMMAND");
    let mut lines = vec![Line::styled(
        header.chars().take(area.width as usize).collect::<String>(),
        style(app, Style::default().add_modifier(Modifier::REVERSED)),
    )];
    if app.rows.is_empty() {
        lines.push(Line::raw(if !app.filter.is_empty() {
            " No holder matches the filter."
        } else if app.snapshot.as_ref().is_some_and(|s| s.may_miss_holders()) {
            " No process seen from this PID namespace holds or watches these GPUs (see ? below)."
        } else {
            " No process holds or watches these GPUs."
        }));
        return lines;
    }
    let visible = (area.height as usize).saturating_sub(1).max(1);
    let first = app.cursor.saturating_sub(visible - 1);
    for (n, row) in app.rows.iter().enumerate().skip(first).take(visible) {
        let text = row_text(
            row,
            app.tagged.contains(&row.pid),
            columns,
            area.width as usize,
        );
        let mut line_style = Style::default();
        if row.flags.contains("orphaned") || row.flags.contains("supervisor_gone") {
            line_style = line_style.fg(Color::Yellow);
        }
        if n == app.cursor {
            // Reversed, with a mark that reads without colour too.
            line_style = Style::default().add_modifier(Modifier::REVERSED);
            let marked: String = std::iter::once('>').chain(text.chars().skip(1)).collect();
            lines.push(Line::styled(marked, line_style));
            continue;
        }
        lines.push(Line::styled(text, style(app, line_style)));
    }
    lines
}

fn bottom_lines(app: &App) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let detail = app
        .selected()
        .and_then(|row| {
            row.reason
                .clone()
                .map(|reason| format!("{}: {reason}", row.pid))
        })
        .unwrap_or_default();
    lines.push(Line::styled(
        detail,
        style(app, Style::default().fg(Color::Yellow)),
    ));
    for line in app.footer_lines() {
        lines.push(Line::raw(line));
    }
    lines.push(Line::styled(
        app.keys_line(),
        style(app, Style::default().add_modifier(Modifier::DIM)),
    ));
    lines
}

fn popup(frame: &mut Frame, area: Rect, lines: Vec<String>, app: &App) {
    let width = area.width.saturating_sub(4).max(10);
    // Each line as wrapped at the inner width.
    let inner = width.saturating_sub(2).max(1) as usize;
    let wrapped: usize = lines
        .iter()
        .map(|line| line.chars().count().div_ceil(inner).max(1))
        .sum();
    let height = (wrapped as u16 + 2)
        .min(area.height.saturating_sub(2))
        .max(3);
    let rect = Rect {
        x: area.x + area.width.saturating_sub(width) / 2,
        y: area.y + (area.height.saturating_sub(height)) / 2,
        width,
        height,
    };
    let text: Vec<Line> = lines.into_iter().map(Line::raw).collect();
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(app.popup_title()))
            .scroll((app.popup_scroll, 0)),
        rect,
    );
}
