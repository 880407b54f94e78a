//! The live view of `gpureap top` (the `top` feature, ratatui).
//! Snapshots are taken on a thread of their own (a slow driver never
//! freezes the keys; the header shows how old the data is), frees run on a
//! thread of their own through `reap::free` (`act`), and the terminal is
//! given back on every way out: `q`, Ctrl-C, SIGTERM/SIGHUP/SIGINT, an error,
//! a panic; the view ends when its terminal goes and answers its signals
//! while nobody reads it (`term`). `top -H HOST` shows one remote host
//! through one ssh (`remote`), whose `gpureap top --json` (`super::stream`)
//! is the sampler there.

mod act;
mod model;
mod remote;
mod term;
mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::terminal;

use crate::driver::{Activity, Driver};
use crate::exit::Exit;
use crate::pace::Pace;
use crate::remote::Fleet;
use crate::request::TopRequest;
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
    /// A full look.
    Local(Box<Snapshot>),
    /// The last full look checked and still true: the driver's figures and
    /// the holders' context (`pace::Pace`) unchanged; what each GPU is
    /// doing, read afresh (it moves when nothing else does).
    Checked(BTreeMap<u32, Activity>),
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
    /// When the sampler last found the data still true (no full look).
    checked: Option<Instant>,
    history: History,
    bars: Vec<GpuBar>,
    /// What no process seen from here explains, per GPU, and why.
    unseen: Vec<String>,
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
            checked: None,
            history: History::default(),
            bars: Vec::new(),
            unseen: Vec::new(),
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
                self.unseen = model::unseen_lines(&snapshot);
                self.snapshot = Some(*snapshot);
            }
            Sample::Checked(activity) => {
                self.checked = Some(Instant::now());
                if let Some(snapshot) = self.snapshot.as_mut() {
                    snapshot.activity = activity;
                    self.bars = model::bars(snapshot);
                    self.arrange();
                }
                return;
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
        self.checked = None;
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
        // The age of the last full look, and of the last check that found
        // it still true (the driver's figures and the holders unchanged).
        let age = match (self.received, self.checked) {
            (Some(at), Some(checked)) => format!(
                "data {} old, checked {} ago",
                Elapsed(at.elapsed()),
                Elapsed(checked.elapsed())
            ),
            (Some(at), None) => format!("data {} old", Elapsed(at.elapsed())),
            (None, _) => "taking the first snapshot…".to_string(),
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
        let mut lines = self.unseen.clone();
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

Bars: # used by a process (a colour each), ! held by no process, . free,
? unseen: from a PID namespace of its own, processes the driver leaves
out may hold it (never driver-held; run gpureap on the host to tell).
Flags and reasons are status's; `gpureap status --help` explains them.";

/// The terminal in raw mode on the alternate screen, given back when
/// dropped (the last frame and the way out written within a bound) and,
/// without waiting, from the panic hook.
struct Screen {
    output: term::Output,
}

impl Screen {
    fn enter(
        saved: Option<libc::termios>,
    ) -> io::Result<(Screen, Terminal<CrosstermBackend<term::Frames>>)> {
        let output = term::Output::start()?;
        terminal::enable_raw_mode()?;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            term::restore_now(saved.as_ref());
            previous(info);
        }));
        output.enter();
        let terminal = Terminal::new(CrosstermBackend::new(output.frames()))?;
        Ok((Screen { output }, terminal))
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.output.leave();
    }
}

/// Takes samples on a thread of its own until the view is gone (its
/// receiver dropped, `open` cleared, or an ending signal caught): locally,
/// a full look only when `Pace` says one is due (the figures moved, a holder
/// or its context died, every `FULL_LOOK_EVERY` cycles, or a wake after a
/// free), and a check otherwise, a change of the driver's figures ending the
/// wait at once; with -H, the remote host's documents as they come. A
/// message on the returned sender asks for one at once (after a free; with
/// -H, a reconnection).
fn sampler(
    source: &Source,
    interval: Duration,
    open: Arc<AtomicBool>,
    ending: Arc<AtomicI32>,
) -> (Receiver<Sample>, Sender<()>, thread::JoinHandle<()>) {
    let (samples, received) = mpsc::sync_channel::<Sample>(1);
    let (wake, woken) = mpsc::channel::<()>();
    let handle = match source {
        Source::Local(driver) => {
            let driver = Arc::clone(driver);
            thread::spawn(move || local_samples(driver, interval, open, ending, samples, woken))
        }
        Source::Remote(link) => {
            let link = Arc::clone(link);
            thread::spawn(move || remote::sample(link, samples, woken))
        }
    };
    (received, wake, handle)
}

/// The local sampler's loop (`sampler`): full looks as `Pace` says, checks
/// between them, until the view is gone.
fn local_samples(
    driver: Arc<dyn Driver>,
    interval: Duration,
    open: Arc<AtomicBool>,
    ending: Arc<AtomicI32>,
    samples: mpsc::SyncSender<Sample>,
    woken: Receiver<()>,
) {
    let going = move || open.load(Ordering::SeqCst) && ending.load(Ordering::SeqCst) == 0;
    let mut pace = Pace::default();
    driver.will_wait();
    let mut force = true;
    while going() {
        // A change is looked at again a moment later: a process caught
        // between its first step and its context (the figures moved, its
        // node not yet open) is seen whole by then.
        let settle = pace.changed();
        let sample = if pace.full_look_due(force) {
            let mut snapshot = Snapshot::take(driver.as_ref());
            pace.looked(&snapshot);
            snapshot.read_activity(driver.as_ref());
            Sample::Local(Box::new(snapshot))
        } else {
            let gpus = 0..driver.gpu_count().unwrap_or(0);
            Sample::Checked(gpus.map(|index| (index, driver.activity(index))).collect())
        };
        if samples.send(sample).is_err() {
            return;
        }
        force = settle;
        let deadline = Instant::now() + if settle { SETTLE } else { interval };
        while going() && !pace.changed() {
            match woken.try_recv() {
                Ok(()) => {
                    force = true;
                    break;
                }
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            pace.wait(driver.as_ref(), left.min(WAKE_CHECK));
        }
    }
}

/// How long after a look that a change caused the next look follows.
const SETTLE: Duration = Duration::from_millis(250);

/// How often the sampler's wait looks for a wake or the view's end.
const WAKE_CHECK: Duration = Duration::from_millis(200);

/// How the view ended.
enum End {
    Quit,
    Signal(i32),
    Gone(term::Gone),
}

/// Runs the view until the user quits, a signal ends it or its terminal goes.
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
    let saved = term::modes();
    let stops = term::Stops::register(saved)?;
    let guard = Guard::for_this_process(&request.protect);
    let open = Arc::new(AtomicBool::new(true));
    let (snapshots, wake, handle) =
        sampler(&source, request.interval, Arc::clone(&open), stops.ending());
    let (events_to, events) = mpsc::channel::<act::Event>();
    let mut app = match &source {
        Source::Local(driver) => App::new(driver.describe(), request.clone()),
        Source::Remote(link) => {
            let mut app = App::new(String::new(), request.clone());
            app.host = Some(link.host.clone());
            app
        }
    };
    let (screen, mut terminal) = Screen::enter(saved)?;
    let mut input = term::Input::new();
    let mut drawn = Instant::now();
    let mut dirty = true;
    let end = loop {
        if let Some(signal) = stops.caught() {
            break End::Signal(signal);
        }
        if let Some(gone) = screen.output.gone() {
            break End::Gone(gone);
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
        dirty |= stops.resized();
        // A frame only once the last is through: a pane nobody reads holds
        // the writer, never this loop.
        if (dirty || drawn.elapsed() >= Duration::from_secs(1)) && screen.output.idle() {
            terminal.draw(|frame| view::draw(frame, &app))?;
            drawn = Instant::now();
            dirty = false;
        }
        match input.wait(Duration::from_millis(100)) {
            term::Keys::None => {}
            term::Keys::Gone(gone) => break End::Gone(gone),
            term::Keys::Pressed(keys) => {
                dirty = true;
                let quit = keys.into_iter().any(|key| {
                    if key.kind == KeyEventKind::Release {
                        return false;
                    }
                    if app.host.is_some()
                        && matches!(app.mode, Mode::Browse)
                        && key.code == KeyCode::Char('r')
                    {
                        let _ = wake.send(());
                        return false;
                    }
                    on_key(&mut app, key, &guard, &source, &events_to)
                });
                if quit {
                    break End::Quit;
                }
            }
        }
    };
    open.store(false, Ordering::SeqCst);
    drop(screen);
    // The sampler sees its channels closed and ends (with -H, its ssh).
    drop(wake);
    drop(snapshots);
    let exit = match end {
        End::Quit => Exit::Success,
        End::Signal(signal) => Exit::Signalled(signal),
        // As a hangup would end it: nobody is left to read a message.
        End::Gone(gone) => {
            tracing::debug!(why = gone.0, "the terminal is gone");
            Exit::Signalled(libc::SIGHUP)
        }
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
