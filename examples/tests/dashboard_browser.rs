//! The dashboard example in a browser: headless Chromium signs in at the service's
//! `/login`, is taken to the dashboard mounted at `/admin/rowbus`, and the page shows the
//! example's queue with its operations on (no token: the service's sign-in guards them).

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The example's binary, built beside this test by `cargo test`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let debug = exe.parent().and_then(|deps| deps.parent()).expect("target/debug");
    let path = debug.join("examples").join(name);
    assert!(path.is_file(), "{} is not built: run `cargo test -p rowbus-examples`", path.display());
    path
}

/// Chromium, from PATH; the test fails loudly without it.
fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .expect("chromium is not installed: run scripts/services.sh, which installs Debian's `chromium`")
}

/// Stops the example when the test ends, however it ends: with Ctrl-C's signal (SIGINT)
/// first, so that it shuts down and removes its database file as it does at a terminal;
/// killed after 10 s, and its files then removed here.
struct Running(Child);

impl Running {
    /// SIGINT, then SIGKILL after 10 s; waits for the process to end.
    fn stop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = Command::new("kill").args(["-INT", &self.0.id().to_string()]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// The example's SQLite file in the temporary directory, and the files beside it.
    fn files(&self) -> Vec<PathBuf> {
        let name = format!("rowbus-example-dashboard-{}.sqlite", self.0.id());
        ["", "-wal", "-shm", "-journal"]
            .iter()
            .map(|s| std::env::temp_dir().join(format!("{name}{s}")))
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
        for file in self.files() {
            let _ = std::fs::remove_file(file);
        }
    }
}

#[test]
fn a_signed_in_browser_sees_the_dashboard_inside_the_service() {
    let mut child = Command::new(example("dashboard"))
        .args(["--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the dashboard example starts");
    let stdout = child.stdout.take().unwrap();
    let mut running = Running(child);
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).expect("the example prints where it serves");
    let login = first
        .split_whitespace()
        .find(|w| w.starts_with("http://") && w.ends_with("/login"))
        .unwrap_or_else(|| panic!("no sign-in URL in {first:?}"))
        .to_owned();

    let profile = std::env::temp_dir().join(format!("rowbus-example-browser-{}", std::process::id()));
    let mut browser = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=5000", "--dump-dom", &login])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut dom = String::new();
    browser.stdout.take().unwrap().read_to_string(&mut dom).expect("the DOM");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = browser.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "chromium did not finish within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = std::fs::remove_dir_all(&profile);
    assert!(status.success(), "chromium: {status}");

    // Signed in and redirected: the dashboard's page, its figures fetched relative to
    // `/admin/rowbus`, the example's three messages shown, operations on and usable.
    assert!(dom.contains("<title>rowbus</title>"), "not the dashboard's page:\n{dom}");
    assert!(dom.contains(">emails<"), "the queue is not shown:\n{dom}");
    assert!(dom.contains(">operations on<"), "operations are not on:\n{dom}");
    let pause = dom.find(">Pause queue<").unwrap_or_else(|| panic!("no Pause button:\n{dom}"));
    let tag = &dom[dom[..pause].rfind("<button").expect("a button")..pause];
    assert!(!tag.contains("disabled"), "the Pause button is disabled: {tag}");

    // Stopped as a person stops it, it leaves nothing in the temporary directory.
    running.stop();
    let left: Vec<PathBuf> = running.files().into_iter().filter(|f| f.exists()).collect();
    assert!(left.is_empty(), "the example left {left:?}");
}
