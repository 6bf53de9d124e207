//! `--server-faults`: a throwaway PostgreSQL or MariaDB server of the harness's own (its
//! own data directory under the run directory, its own port on 127.0.0.1), crashed hard
//! mid-run (`pg_ctl stop -m immediate`, `kill -9`) and started again. The shared servers
//! are never touched.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rowbus::Backend;
use sqlx::{ConnectOptions as _, Connection as _, Executor as _};
use tokio::process::{Child, Command};

use super::BoxError;

/// A server the harness owns.
#[derive(Debug)]
pub(crate) struct Server {
    backend: Backend,
    dir: PathBuf,
    port: u16,
    /// PostgreSQL: the directory of `initdb` and `pg_ctl`.
    pg_bin: PathBuf,
    /// The user PostgreSQL runs as when the harness runs as root (`initdb` refuses root).
    pg_user: Option<String>,
    /// MariaDB: the running server.
    mariadbd: Option<Child>,
    /// PostgreSQL: whether `pg_ctl` may have a server running (stopped when dropped).
    pg_running: bool,
}

/// A TCP port nobody listens on now.
fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The output of a command that must succeed.
async fn run(mut command: Command, what: &str) -> Result<String, BoxError> {
    let output = command.stdin(Stdio::null()).output().await.map_err(|e| format!("{what}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        return Err(format!("{what} failed ({}): {} {}", output.status, stderr.trim(), stdout.trim()).into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The newest PostgreSQL's binaries: `initdb` on the PATH, or Debian's
/// `/usr/lib/postgresql/<version>/bin`.
fn pg_bin() -> Result<PathBuf, BoxError> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file());
    if let Some(dir) = on_path {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no initdb on the PATH nor in /usr/lib/postgresql: {e}"))?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| "no PostgreSQL binaries found".into())
}

impl Server {
    /// Creates and starts a server of `backend`'s kind in `dir`, with a database `test`.
    pub(crate) async fn create(backend: Backend, dir: &Path) -> Result<Self, BoxError> {
        std::fs::create_dir_all(dir)?;
        let mut server = Server {
            backend,
            dir: dir.to_owned(),
            port: free_port()?,
            pg_bin: PathBuf::new(),
            pg_user: None,
            mariadbd: None,
            pg_running: false,
        };
        match backend {
            Backend::Postgres => {
                server.pg_bin = pg_bin()?;
                let uid = run(cmd("id", &["-u"]), "id -u").await?;
                if uid == "0" {
                    // initdb and postgres refuse to run as root.
                    let user = "postgres";
                    let owner = run(cmd("id", &["-u", user]), "id -u postgres").await?;
                    std::os::unix::fs::chown(dir, Some(owner.parse()?), None)?;
                    server.pg_user = Some(user.to_owned());
                }
                let data = server.data();
                let mut initdb = server.pg_command("initdb");
                initdb.arg("-D").arg(&data).args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]);
                run(initdb, "initdb").await?;
            }
            Backend::MySql => {
                let mut install = Command::new("mariadb-install-db");
                install
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", server.data().display()))
                    .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                    .arg(format!("--user={}", run(cmd("id", &["-un"]), "id -un").await?));
                run(install, "mariadb-install-db").await?;
            }
            Backend::Sqlite => return Err("--server-faults needs a postgres:// or mysql:// URL".into()),
        }
        server.start().await?;
        let create = match backend {
            Backend::Postgres => "CREATE DATABASE test",
            _ => "CREATE DATABASE IF NOT EXISTS test",
        };
        server.admin(if backend == Backend::Postgres { "postgres" } else { "mysql" }, create).await?;
        Ok(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pg_command(&self, program: &str) -> Command {
        let path = self.pg_bin.join(program);
        match &self.pg_user {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(path);
                command
            }
            None => Command::new(path),
        }
    }

    /// The administrator's URL of database `test`.
    pub(crate) fn url(&self) -> String {
        match self.backend {
            Backend::Postgres => format!("postgres://postgres@127.0.0.1:{}/test", self.port),
            _ => format!("mysql://root@127.0.0.1:{}/test", self.port),
        }
    }

    /// Runs one statement as the administrator on `database`.
    async fn admin(&self, database: &str, statement: &'static str) -> Result<(), BoxError> {
        let url = match self.backend {
            Backend::Postgres => format!("postgres://postgres@127.0.0.1:{}/{database}", self.port),
            _ => format!("mysql://root@127.0.0.1:{}/{database}", self.port),
        };
        match self.backend {
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&url).await?;
                conn.execute(statement).await?;
                conn.close().await?;
            }
            _ => {
                let mut conn = sqlx::MySqlConnection::connect(&url).await?;
                conn.execute(statement).await?;
                conn.close().await?;
            }
        }
        Ok(())
    }

    /// Starts the server; returns once it accepts connections.
    pub(crate) async fn start(&mut self) -> Result<(), BoxError> {
        match self.backend {
            Backend::Postgres => {
                let mut ctl = self.pg_command("pg_ctl");
                let options = format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300",
                    self.port,
                    self.dir.display()
                );
                ctl.arg("-D").arg(self.data()).args(["-o", &options, "-l"]).arg(self.dir.join("server.log"));
                ctl.args(["-w", "-t", "60", "start"]).stdout(Stdio::null());
                self.pg_running = true;
                run(ctl, "pg_ctl start").await?;
            }
            _ => {
                let log =
                    std::fs::File::options().create(true).append(true).open(self.dir.join("server.log"))?;
                let mut mariadbd = Command::new("mariadbd");
                mariadbd
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", self.data().display()))
                    .arg(format!("--port={}", self.port))
                    .arg(format!("--socket={}", self.dir.join("mysqld.sock").display()))
                    .arg(format!("--pid-file={}", self.dir.join("mysqld.pid").display()))
                    .args(["--bind-address=127.0.0.1", "--skip-name-resolve", "--max-connections=300"])
                    .arg(format!("--user={}", run(cmd("id", &["-un"]), "id -un").await?))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::from(log))
                    .kill_on_drop(true);
                self.mariadbd = Some(mariadbd.spawn()?);
            }
        }
        self.wait_up().await
    }

    async fn wait_up(&mut self) -> Result<(), BoxError> {
        let url = self.url();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let up = match self.backend {
                Backend::Postgres => {
                    let options: sqlx::postgres::PgConnectOptions =
                        url.replace("/test", "/postgres").parse()?;
                    options.connect().await.is_ok()
                }
                _ => {
                    let options: sqlx::mysql::MySqlConnectOptions = url.replace("/test", "/mysql").parse()?;
                    options.connect().await.is_ok()
                }
            };
            if up {
                return Ok(());
            }
            if let Some(child) = &mut self.mariadbd
                && let Some(status) = child.try_wait()?
            {
                return Err(format!(
                    "mariadbd exited ({status}); see {}",
                    self.dir.join("server.log").display()
                )
                .into());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "the throwaway server did not come up; see {}",
                    self.dir.join("server.log").display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the server hard: no shutdown checkpoint, no goodbye to clients.
    pub(crate) async fn crash(&mut self) -> Result<(), BoxError> {
        match self.backend {
            Backend::Postgres => {
                let mut ctl = self.pg_command("pg_ctl");
                ctl.arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "stop"]).stdout(Stdio::null());
                run(ctl, "pg_ctl stop -m immediate").await?;
                self.pg_running = false;
            }
            _ => {
                if let Some(mut child) = self.mariadbd.take() {
                    child.kill().await?; // SIGKILL, then reaped
                }
            }
        }
        Ok(())
    }

    /// Stops the server for good (the run is over).
    pub(crate) async fn destroy(mut self) {
        let _ = self.crash().await;
    }
}

impl Drop for Server {
    /// A run that failed midway still stops its PostgreSQL (`pg_ctl` detaches it); a
    /// MariaDB child is killed on drop by itself.
    fn drop(&mut self) {
        if self.pg_running {
            let path = self.pg_bin.join("pg_ctl");
            let mut ctl = match &self.pg_user {
                Some(user) => {
                    let mut c = std::process::Command::new("runuser");
                    c.args(["-u", user, "--"]).arg(path);
                    c
                }
                None => std::process::Command::new(path),
            };
            let _ = ctl
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn cmd(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}
