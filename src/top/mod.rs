//! `gpureap top`: a live view over the same pipeline as `status` and `free`.
//! Snapshots are taken on a thread of their own (a slow driver never
//! freezes the keys; the header shows how old the data is), frees run on a
//! thread of their own through `reap::free` (`act`), and the terminal is
//! given back on every way out: `q`, Ctrl-C, SIGTERM/SIGHUP/SIGINT, an error,
//! a panic. `top -H HOST` shows one remote host through one ssh
//! (`remote`), whose `gpureap top --json` (`stream`) is the sampler there.

mod act;
mod model;
mod remote;
pub mod stream;
mod view;

use std::collections::BTreeSet;
use std::io::{self, Stdout};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{cursor, execute, terminal};

use crate::config::TopRequest;
use crate::driver::Driver;
use crate::exit::Exit;
use crate::fleet::Fleet;
use crate::select::Guard;
use crate::snapshot::Snapshot;
use crate::units::{Elapsed, one_line};

use act::{Planned, Target};

use model::{GpuBar, History, Row, Sort};

/// What the view is doing besides showing.
enum Mode {
    Browse,
    Filter,
    Help,
    /// Waiting for the remote host's plan (`top -H`).
    Asking,
    Confirm(Plan),
    Freeing,
}

/// A plan shown for confirmation: made here, or by the remote host.
enum Plan {
    Local(Box<Planned>),
    Remote(remote::Planned),
}

impl Plan {
    fn text(&self) -> &[String] {
        match self {
            Plan::Local(planned) => &planned.text,
            Plan::Remote(planned) => &planned.text,
        }
    }
}

/// What the sampler's thread sends the view.
pub enum Sample {
    Local(Box<Snapshot>),
    /// A document from the remote host (`top -H`).
    Remote(Box<remote::Status>),
    /// The remote connection's state.
    Link(remote::LinkState),
}

/// Where the data comes from and the frees go.
enum Source {
    Local(Arc<dyn Driver>),
    Remote(Arc<remote::Link>),
}

/// The view's state, drawn by `view::draw`.
pub struct App {
    backend: String,
    request: TopRequest,
    snapshot: Option<Snapshot>,
    /// `top -H`: the host's last document, its name, its connection.
    remote: Option<Box<remote::Status>>,
    host: Option<String>,
    link: Option<remote::LinkState>,
    received: Option<Instant>,
    history: History,
    bars: Vec<GpuBar>,
    rows: Vec<Row>,
    cursor: usize,
    tagged: BTreeSet<u32>,
    filter: String,
    sort: Sort,
    tree: bool,
    mode: Mode,
    message: Option<String>,
    progress: Option<String>,
    result: Vec<String>,
    popup_scroll: u16,
    color: bool,
    ascii: bool,
}

impl App {
    fn new(backend: String, request: TopRequest) -> App {
        let term = std::env::var("TERM").unwrap_or_default();
        let dumb = term == "dumb" || term.is_empty();
        App {
            backend: one_line(&backend).into_owned(),
            request,
            snapshot: None,
            remote: None,
            host: None,
            link: None,
            received: None,
            history: History::default(),
            bars: Vec::new(),
            rows: Vec::new(),
            cursor: 0,
            tagged: BTreeSet::new(),
            filter: String::new(),
            sort: Sort::Memory,
            tree: false,
            mode: Mode::Browse,
            message: None,
            progress: None,
            result: Vec::new(),
            popup_scroll: 0,
            color: std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty()) && !dumb,
            ascii: dumb,
        }
    }

    fn take(&mut self, sample: Sample) {
        match sample {
            Sample::Local(snapshot) => {
                self.history.record(&snapshot);
                self.bars = model::bars(&snapshot);
                self.snapshot = Some(*snapshot);
            }
            Sample::Remote(status) => {
                self.history.record_used(status.used());
                self.bars = status.bars.clone();
                self.backend = status.backend.clone();
                self.remote = Some(status);
            }
            Sample::Link(state) => {
                self.link = Some(state);
                return;
            }
        }
        self.received = Some(Instant::now());
        self.arrange();
    }

    /// Rebuilds the rows from the snapshot, keeping the cursor on its PID.
    fn arrange(&mut self) {
        let selected = self.selected().map(|row| row.pid);
        let live: BTreeSet<u32> = if let Some(remote) = &self.remote {
            self.rows = model::arrange_by(
                |pid| remote.ancestors(pid),
                remote.rows.clone(),
                &self.filter,
                self.sort,
                self.tree,
            );
            remote.pids()
        } else if let Some(snapshot) = &self.snapshot {
            self.rows = model::arrange(
                snapshot,
                model::rows(snapshot),
                &self.filter,
                self.sort,
                self.tree,
            );
            snapshot.processes.keys().copied().collect()
        } else {
            return;
        };
        self.tagged.retain(|pid| live.contains(pid));
        self.cursor = selected
            .and_then(|pid| self.rows.iter().position(|row| row.pid == pid))
            .unwrap_or(self.cursor)
            .min(self.rows.len().saturating_sub(1));
    }

    fn selected(&self) -> Option<&Row> {
        self.rows.get(self.cursor)
    }

    fn header(&self) -> String {
        let age = match self.received {
            Some(at) => format!("data {} old", Elapsed(at.elapsed())),
            None => "taking the first snapshot…".to_string(),
        };
        let host = self
            .host
            .as_ref()
            .map(|host| format!(" {host}"))
            .unwrap_or_default();
        let lost = self
            .link
            .as_ref()
            .and_then(remote::LinkState::word)
            .map(|word| format!(" · {word}"))
            .unwrap_or_default();
        let mut text = format!(
            "gpureap top{host}{lost} · {age} · {} holders · sort {}{}",
            self.rows.len(),
            self.sort.name(),
            if self.tree { " · tree" } else { "" }
        );
        if !self.filter.is_empty() || matches!(self.mode, Mode::Filter) {
            text.push_str(&format!(" · filter /{}", self.filter));
        }
        if self.request.readonly {
            text.push_str(" · read-only");
        } else if act::euid() != 0 && self.host.is_none() {
            text.push_str(&format!(
                " · not root: only uid {}'s processes",
                act::euid()
            ));
        }
        text.push_str(&format!(" · {}", self.backend));
        text
    }

    fn footer_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let (Some(host), Some(link)) = (&self.host, &self.link) {
            lines.extend(link.line(host));
        }
        lines.extend(self.message.clone());
        lines.extend(self.progress.clone());
        lines.extend(self.result.iter().cloned());
        lines
    }

    fn keys_line(&self) -> String {
        match self.mode {
            Mode::Filter => "type to filter · Enter keep · Esc clear".to_string(),
            Mode::Confirm(_) => "y: free as planned · n/Esc: cancel · ↑↓ scroll".to_string(),
            Mode::Asking => "asking the host for the plan… (q quits the view)".to_string(),
            Mode::Freeing => "freeing… (q quits the view; the free goes on until verified)".to_string(),
            _ if self.request.readonly => "↑↓/jk move · / filter · t tree · s sort · ? help · q quit".to_string(),
            _ => "↑↓/jk · / filter · t tree · s sort · space tag · x free · g GPU · o orphans · ? · q"
                .to_string(),
        }
    }

    fn popup_title(&self) -> &'static str {
        match self.mode {
            Mode::Confirm(_) => " plan: free these? [y/N] ",
            _ => " gpureap top: keys ",
        }
    }

    fn popup(&self) -> Option<Vec<String>> {
        match &self.mode {
            Mode::Confirm(plan) => Some(plan.text().to_vec()),
            Mode::Help => Some(HELP.lines().map(str::to_string).collect()),
            _ => None,
        }
    }
}

const HELP: &str = "↑/↓ or j/k   move            PgUp/PgDn, Home/End
/            filter (PID, user, flags, container, command)
t            tree: each holder under its nearest holder ancestor
s            sort: memory, pid, command
space        tag the selected holder
x            free the tagged holders (or the selected one) and their descendants
g            free every holder of the selected holder's GPU
o            free all orphans (a crashed launcher's workers)
             each free shows the plan and asks; y goes, n cancels
r            with -H: reconnect now
q, Esc       quit (Ctrl-C too)

Bars: # used by a process (a colour each), ! held by no process, . free.
Flags and reasons are status's; `gpureap status --help` explains them.";

/// Gives the terminal back when dropped, and from the panic hook.
struct Screen;

impl Screen {
    fn enter() -> io::Result<(Screen, Terminal<CrosstermBackend<Stdout>>)> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        execute!(io::stdout(), terminal::EnterAlternateScreen, cursor::Hide)?;
        let terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
        Ok((screen, terminal))
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

fn restore() {
    let _ = execute!(io::stdout(), terminal::LeaveAlternateScreen, cursor::Show);
    let _ = terminal::disable_raw_mode();
}

/// Takes samples on a thread of its own until the view is gone: local
/// snapshots every `interval`, or the remote host's documents as they come.
/// A message on the returned sender asks for one at once (after a free;
/// with -H, a reconnection).
fn sampler(
    source: &Source,
    interval: Duration,
) -> (Receiver<Sample>, Sender<()>, thread::JoinHandle<()>) {
    let (samples, received) = mpsc::sync_channel::<Sample>(1);
    let (wake, woken) = mpsc::channel::<()>();
    let handle = match source {
        Source::Local(driver) => {
            let driver = Arc::clone(driver);
            thread::spawn(move || {
                loop {
                    let snapshot = Snapshot::take(driver.as_ref());
                    if samples.send(Sample::Local(Box::new(snapshot))).is_err() {
                        return;
                    }
                    match woken.recv_timeout(interval) {
                        Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
        }
        Source::Remote(link) => {
            let link = Arc::clone(link);
            thread::spawn(move || remote::sample(link, samples, woken))
        }
    };
    (received, wake, handle)
}

/// Runs the view until the user quits or a signal ends it.
pub fn run(driver: Arc<dyn Driver>, request: &TopRequest) -> io::Result<Exit> {
    let (exit, _sampler) = show(Source::Local(driver), request)?;
    Ok(exit)
}

/// `top -H HOST`: the view of one remote host (`remote`). When it closes,
/// its ssh is ended (and with it, the host's `gpureap top --json`) before
/// this returns.
pub fn run_remote(fleet: Fleet, request: &TopRequest) -> io::Result<Exit> {
    let link = Arc::new(remote::Link::new(fleet, request));
    let (exit, sampler) = show(Source::Remote(link), request)?;
    let _ = sampler.join();
    Ok(exit)
}

/// The view on a source, until it closes; its sampler, told to stop.
fn show(source: Source, request: &TopRequest) -> io::Result<(Exit, thread::JoinHandle<()>)> {
    let mut stops = Vec::new();
    for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        let flag = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal, Arc::clone(&flag))?;
        stops.push((signal, flag));
    }
    let guard = Guard::for_this_process(&request.protect);
    let (snapshots, wake, handle) = sampler(&source, request.interval);
    let (events_to, events) = mpsc::channel::<act::Event>();
    let mut app = match &source {
        Source::Local(driver) => App::new(driver.describe(), request.clone()),
        Source::Remote(link) => {
            let mut app = App::new(String::new(), request.clone());
            app.host = Some(link.host.clone());
            app
        }
    };
    let (screen, mut terminal) = Screen::enter()?;
    let mut drawn = Instant::now();
    let mut dirty = true;
    let caught = loop {
        let caught = stops
            .iter()
            .find(|(_, flag)| flag.load(Ordering::Relaxed))
            .map(|(signal, _)| *signal);
        if caught.is_some() {
            break caught;
        }
        while let Ok(sample) = snapshots.try_recv() {
            app.take(sample);
            dirty = true;
        }
        // The age of the data, and a retry's count-down, move on their own.
        while let Ok(event) = events.try_recv() {
            on_free_event(&mut app, event, &wake);
            dirty = true;
        }
        if dirty || drawn.elapsed() >= Duration::from_secs(1) {
            terminal.draw(|frame| view::draw(frame, &app))?;
            drawn = Instant::now();
            dirty = false;
        }
        if !event::poll(Duration::from_millis(100))? {
            continue;
        }
        dirty = true;
        if let Event::Key(key) = event::read()?
            && key.kind != KeyEventKind::Release
        {
            if app.host.is_some()
                && matches!(app.mode, Mode::Browse)
                && key.code == KeyCode::Char('r')
            {
                let _ = wake.send(());
                continue;
            }
            if on_key(&mut app, key, &guard, &source, &events_to) {
                break None;
            }
        }
    };
    drop(screen);
    // The sampler sees its channels closed and ends (with -H, its ssh).
    drop(wake);
    drop(snapshots);
    let exit = match caught {
        Some(signal) => Exit::Signalled(signal),
        None => Exit::Success,
    };
    Ok((exit, handle))
}

fn on_free_event(app: &mut App, event: act::Event, wake: &Sender<()>) {
    match event {
        act::Event::Progress(text) => app.progress = Some(one_line(&text).into_owned()),
        act::Event::Done(outcome) => {
            app.progress = None;
            app.result = act::result_lines(&outcome);
            app.mode = Mode::Browse;
            app.tagged.clear();
            let _ = wake.send(());
        }
        act::Event::Planned(planned) => {
            app.progress = None;
            match planned {
                Ok(planned) if matches!(app.mode, Mode::Asking) => {
                    app.popup_scroll = 0;
                    app.mode = Mode::Confirm(Plan::Remote(*planned));
                }
                Ok(_) => {}
                Err(why) => {
                    app.message = Some(one_line(&why).into_owned());
                    app.mode = Mode::Browse;
                }
            }
        }
        act::Event::Finished(lines) => {
            app.progress = None;
            app.result = lines
                .iter()
                .map(|line| one_line(line).into_owned())
                .collect();
            app.mode = Mode::Browse;
            app.tagged.clear();
        }
    }
}

/// Handles one key; true when the view should close.
fn on_key(
    app: &mut App,
    key: KeyEvent,
    guard: &Guard,
    source: &Source,
    events: &Sender<act::Event>,
) -> bool {
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return true;
    }
    match std::mem::replace(&mut app.mode, Mode::Browse) {
        Mode::Filter => {
            filter_key(app, key);
            false
        }
        Mode::Help => false,
        Mode::Confirm(plan) => {
            confirm_key(app, key, plan, guard, source, events);
            false
        }
        Mode::Freeing => {
            app.mode = Mode::Freeing;
            matches!(key.code, KeyCode::Char('q'))
        }
        Mode::Asking => {
            app.mode = Mode::Asking;
            matches!(key.code, KeyCode::Char('q'))
        }
        Mode::Browse => browse_key(app, key, guard, source, events),
    }
}

fn filter_key(app: &mut App, key: KeyEvent) {
    match key.code {
        KeyCode::Enter => return,
        KeyCode::Esc => app.filter.clear(),
        KeyCode::Backspace => {
            app.filter.pop();
        }
        KeyCode::Char(c) if !c.is_control() => app.filter.push(c),
        _ => {}
    }
    app.mode = Mode::Filter;
    app.arrange();
    if key.code == KeyCode::Esc {
        app.mode = Mode::Browse;
    }
}

fn confirm_key(
    app: &mut App,
    key: KeyEvent,
    planned: Plan,
    guard: &Guard,
    source: &Source,
    events: &Sender<act::Event>,
) {
    match key.code {
        KeyCode::Char('y') | KeyCode::Char('Y') => {
            app.result.clear();
            app.message = None;
            app.progress = Some("starting…".to_string());
            match (planned, source) {
                (Plan::Local(planned), Source::Local(driver)) => act::start(
                    Arc::clone(driver),
                    *planned,
                    guard.clone(),
                    app.request.options,
                    events.clone(),
                ),
                (Plan::Remote(planned), Source::Remote(link)) => {
                    remote::free(Arc::clone(link), planned, &app.request, events.clone())
                }
                // A plan is made by its own source: never another's.
                _ => app.progress = None,
            }
            app.mode = Mode::Freeing;
        }
        KeyCode::Down | KeyCode::Char('j') => {
            app.popup_scroll = app.popup_scroll.saturating_add(1);
            app.mode = Mode::Confirm(planned);
        }
        KeyCode::Up | KeyCode::Char('k') => {
            app.popup_scroll = app.popup_scroll.saturating_sub(1);
            app.mode = Mode::Confirm(planned);
        }
        _ => app.message = Some("Cancelled: nothing was signalled.".to_string()),
    }
}

fn browse_key(
    app: &mut App,
    key: KeyEvent,
    guard: &Guard,
    source: &Source,
    events: &Sender<act::Event>,
) -> bool {
    let last = app.rows.len().saturating_sub(1);
    match key.code {
        KeyCode::Char('q') | KeyCode::Esc => return true,
        KeyCode::Down | KeyCode::Char('j') => app.cursor = (app.cursor + 1).min(last),
        KeyCode::Up | KeyCode::Char('k') => app.cursor = app.cursor.saturating_sub(1),
        KeyCode::PageDown => app.cursor = (app.cursor + 10).min(last),
        KeyCode::PageUp => app.cursor = app.cursor.saturating_sub(10),
        KeyCode::Home => app.cursor = 0,
        KeyCode::End => app.cursor = last,
        KeyCode::Char('/') => app.mode = Mode::Filter,
        KeyCode::Char('?') => app.mode = Mode::Help,
        KeyCode::Char('t') => {
            app.tree = !app.tree;
            app.arrange();
        }
        KeyCode::Char('s') => {
            app.sort = app.sort.next();
            app.arrange();
        }
        KeyCode::Char(' ') => {
            if let Some(pid) = app.selected().map(|row| row.pid)
                && !app.tagged.remove(&pid)
            {
                app.tagged.insert(pid);
            }
        }
        KeyCode::Char('x') => {
            let pids = if app.tagged.is_empty() {
                app.selected().map(|row| row.pid).into_iter().collect()
            } else {
                app.tagged.clone()
            };
            ask(app, Target::Pids(pids), guard, source, events);
        }
        KeyCode::Char('g') => {
            let gpu = app.selected().and_then(|row| match &app.remote {
                Some(remote) => remote
                    .gpus_of
                    .get(&row.pid)
                    .and_then(|gpus| gpus.first().copied()),
                None => app
                    .snapshot
                    .as_ref()
                    .and_then(|snapshot| snapshot.gpus_used_by(row.pid).first().copied()),
            });
            match gpu {
                Some(gpu) => ask(app, Target::Gpu(gpu), guard, source, events),
                None => app.message = Some("The selected process uses no GPU.".to_string()),
            }
        }
        KeyCode::Char('o') => ask(app, Target::Orphans, guard, source, events),
        _ => {}
    }
    false
}

/// Shows the plan for a target and asks, or says why not. With -H the
/// host plans (its `free --dry-run`), and the view waits for it.
fn ask(app: &mut App, target: Target, guard: &Guard, source: &Source, events: &Sender<act::Event>) {
    if app.request.readonly {
        app.message =
            Some("Read-only (--readonly): nothing can be signalled from this view.".to_string());
        return;
    }
    if matches!(&target, Target::Pids(pids) if pids.is_empty()) {
        app.message = Some("Nothing selected.".to_string());
        return;
    }
    if let Source::Remote(link) = source {
        app.message = None;
        app.progress = Some(format!(
            "asking {} for the plan (its gpureap free --dry-run)…",
            link.host
        ));
        app.mode = Mode::Asking;
        remote::ask(Arc::clone(link), target, &app.request, events.clone());
        return;
    }
    let Some(snapshot) = &app.snapshot else {
        app.message = Some("No snapshot yet.".to_string());
        return;
    };
    match act::plan(snapshot, &target, guard, app.request.options) {
        Ok(planned) => {
            app.popup_scroll = 0;
            app.mode = Mode::Confirm(Plan::Local(Box::new(planned)));
        }
        Err(why) => app.message = Some(one_line(&why).into_owned()),
    }
}
