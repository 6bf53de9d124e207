"""Creates or drops a scratch database for one system's run of benches/field/run.sh.

  db.py create URL NAME   prints the URL of a new database NAME on URL's server
  db.py drop URL NAME     drops it (for SQLite: deletes the file and its -wal/-shm)

PostgreSQL through psql, MySQL/MariaDB through the mysql client; SQLite is a file
/tmp/field-NAME.sqlite. NAME is made of the script's PID, so a run touches nothing but its own.
"""

import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit


def main() -> None:
    action, url, name = sys.argv[1:4]
    u = urlsplit(url)
    scheme = u.scheme
    if scheme.startswith("sqlite"):
        path = f"/tmp/field-{name}.sqlite"
        if action == "create":
            print(f"sqlite://{path}")
        else:
            for suffix in ("", "-wal", "-shm", "-journal"):
                if os.path.exists(path + suffix):
                    os.remove(path + suffix)
        return
    if scheme in ("postgres", "postgresql"):
        admin = urlunsplit((scheme, u.netloc, u.path, u.query, ""))
        sql = f'create database "{name}"' if action == "create" else f'drop database if exists "{name}" with (force)'
        subprocess.run(["psql", "-q", "-X", admin, "-c", sql], check=True, stdout=subprocess.DEVNULL)
    elif scheme in ("mysql", "mariadb"):
        cmd = ["mysql", "-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306), "-u", u.username or "root"]
        if u.password:
            cmd.append(f"-p{u.password}")
        sql = f"create database `{name}`" if action == "create" else f"drop database if exists `{name}`"
        subprocess.run(cmd + ["-e", sql], check=True)
    else:
        sys.exit(f"db.py: unknown database URL {url}")
    if action == "create":
        print(urlunsplit((scheme, u.netloc, "/" + name, u.query, "")))


main()
