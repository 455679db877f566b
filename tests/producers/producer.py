"""A producer in another language, held to the guide's SQL contract (docs/guide/src/producing.md,
"Enqueue from another language"): every task is one plain INSERT into async_task, written in the producer's own
business transaction together with a row of its own `orders` table.

    producer.py postgres URL
    producer.py sqlite PATH
    producer.py mysql URL [found-rows]   (mysql://user[:password]@host:port/database)

With `found-rows` the MySQL connection has the flag CLIENT_FOUND_ROWS, the default of
Connector/J and of diesel: an INSERT ... ON DUPLICATE KEY UPDATE that finds its row and
changes nothing then reports one affected row, as a created row does.

It commits some orders with their tasks, rolls some back, repeats some (the task INSERT's
ON CONFLICT DO NOTHING; on MySQL ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)) and links
a child under a repeated parent by the id the repeat gave, enqueues tasks with tenant,
priority, max_attempts and a delay, children of one and of two parents, and tries invalid
rows, each of which the database must refuse. It prints one JSON report on stdout, read by
handlers/tests/cli/producers.rs, which then drains the tasks with `outbox-fault drain`
(keyword `fault.ledger`) and checks the effects. Exit 0 unless something unexpected happened
(an invalid row accepted, say).
"""

import json
import sqlite3
import sys
import urllib.parse

KEYWORD = "fault.ledger"


class Db:
    """One connection, the SQL of one backend, explicit transactions."""

    def __init__(self, backend, target, flags=()):
        self.backend = backend
        if backend == "postgres":
            import psycopg

            self.errors = (psycopg.Error,)
            self.conn = psycopg.connect(target)  # not autocommit: a transaction per block
        elif backend == "sqlite":
            self.errors = (sqlite3.Error,)
            self.conn = sqlite3.connect(target, isolation_level=None, timeout=30)
        elif backend == "mysql":
            import pymysql
            from pymysql.constants import CLIENT

            url = urllib.parse.urlparse(target)
            self.errors = (pymysql.Error,)
            # Not autocommit: a transaction per block, as a business service runs them.
            self.conn = pymysql.connect(
                host=url.hostname, port=url.port or 3306, user=url.username,
                password=urllib.parse.unquote(url.password or ""),
                database=url.path.lstrip("/"), charset="utf8mb4", autocommit=False,
                client_flag=CLIENT.FOUND_ROWS if "found-rows" in flags else 0)
        else:
            raise SystemExit(f"unknown backend {backend!r} (postgres, sqlite or mysql)")

    def begin(self):
        if self.backend == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")

    def commit(self):
        if self.backend == "sqlite":
            self.conn.execute("COMMIT")
        else:
            self.conn.commit()

    def rollback(self):
        if self.backend == "sqlite":
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()

    def run(self, sql, params=()):
        """Runs one statement (`?` placeholders); returns the cursor."""
        if self.backend in ("postgres", "mysql"):
            sql = sql.replace("?", "%s")
        cur = self.conn.cursor()
        cur.execute(sql, params)
        return cur

    def later(self, what):
        """The SQL expression of the database clock plus `what` (e.g. '10 minutes')."""
        if self.backend == "postgres":
            return f"now() + interval '{what}'"
        if self.backend == "mysql":
            n, unit = what.split()
            return f"UTC_TIMESTAMP(3) + INTERVAL {int(n)} {unit.rstrip('s').upper()}"
        return f"strftime('%Y-%m-%d %H:%M:%f', 'now', '+{what}')"


def place(db, order_id, biz_id=None, keyword=KEYWORD, biz_data=None, extra=None):
    """The order row and its task, in the open transaction. Returns (task id, created): the id
    of the task created, or of the one there already."""
    if db.backend == "mysql":
        db.run("INSERT INTO orders (id, note) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id",
               (order_id, f"order {order_id}"))
    else:
        db.run("INSERT INTO orders (id, note) VALUES (?, ?) ON CONFLICT (id) DO NOTHING",
               (order_id, f"order {order_id}"))
    cols = ["keyword", "biz_id", "biz_data"]
    vals = ["?", "?", "?"]
    params = [keyword, str(order_id) if biz_id is None else biz_id,
              json.dumps({"order_id": order_id}) if biz_data is None else biz_data]
    for col, (sql, param) in (extra or {}).items():
        cols.append(col)
        vals.append(sql)
        if param is not None:
            params.append(param)
    key = (keyword, params[1])
    if db.backend == "mysql":
        # No RETURNING: LAST_INSERT_ID() is the task's id, created or there already (the
        # update sets it to the existing row's id), and @outbox_created_id is that id only
        # if the row was created. Not the affected-row count: under CLIENT_FOUND_ROWS a
        # duplicate counts one row, as a created row does.
        db.run(
            f"INSERT INTO async_task ({', '.join(cols)}) VALUES ({', '.join(vals)}) "
            "ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)",
            params,
        )
        task_id, created_id = db.run("SELECT LAST_INSERT_ID(), @outbox_created_id").fetchone()
        return task_id, created_id == task_id
    cur = db.run(
        f"INSERT INTO async_task ({', '.join(cols)}) VALUES ({', '.join(vals)}) "
        "ON CONFLICT (keyword, biz_id) DO NOTHING RETURNING id",
        params,
    )
    row = cur.fetchone()
    if row is not None:
        return row[0], True
    return existing_id(db, key), False


def existing_id(db, key):
    """The id of the task `key` (keyword, biz_id), there before this transaction's insert."""
    return db.run("SELECT id FROM async_task WHERE keyword = ? AND biz_id = ?", key).fetchone()[0]


def missing_id(db):
    """A task id below the newest that no task has (a parent must be older than its child, so
    a larger one would break that rule first). Ids leave gaps: PostgreSQL's sequence does not
    roll back (orders 11-15), SQLite's AUTOINCREMENT counts the repeated inserts."""
    db.begin()
    row = db.run(
        "SELECT min(t.id) + 1 FROM async_task t WHERE t.id < (SELECT max(id) FROM async_task) "
        "AND NOT EXISTS (SELECT 1 FROM async_task u WHERE u.id = t.id + 1)"
    ).fetchone()
    db.commit()
    if row[0] is None:
        raise SystemExit("no gap in async_task ids for the missing-parent case")
    return row[0]


def main():
    backend, target, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    if flags and (backend != "mysql" or flags != ["found-rows"]):
        raise SystemExit(f"unknown flags {flags!r} (only: mysql URL found-rows)")
    db = Db(backend, target, flags)
    report = {"committed": [], "rolled_back": [], "repeated": [], "refused": []}

    db.begin()
    if backend == "mysql":
        # UTC for this session too: the task columns' defaults are UTC_TIMESTAMP(3) whatever
        # the session's zone, but a producer's own times should be UTC as well.
        db.run("SET time_zone = '+00:00'")
    db.run("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, note TEXT NOT NULL)")
    db.commit()

    # Committed: orders 1-10, each with its task in one transaction.
    for order in range(1, 11):
        db.begin()
        task_id, created = place(db, order)
        assert created, f"order {order}: task not created"
        if backend == "postgres":
            db.run("NOTIFY outbox_task")  # optional in the contract; must not hurt
        db.commit()
        report["committed"].append({"order": order, "task": task_id})

    # Rolled back: orders 11-15, the order and its task are both gone.
    for order in range(11, 16):
        db.begin()
        place(db, order)
        db.rollback()
        report["rolled_back"].append(order)

    # Repeated: orders 1-3 placed again (a retried request); the task insert is a no-op
    # and gives the existing task's id.
    for order in range(1, 4):
        db.begin()
        task_id, created = place(db, order)
        db.commit()
        report["repeated"].append({"order": order, "created": created, "task": task_id})

    # Options: tenant, priority and max_attempts; and a task delayed by 10 minutes.
    db.begin()
    task_id, _ = place(db, 20, extra={"tenant": ("?", "acme"), "priority": ("?", -5),
                                      "max_attempts": ("?", 3)})
    db.commit()
    report["options"] = {"order": 20, "task": task_id, "tenant": "acme", "priority": -5,
                         "max_attempts": 3}
    db.begin()
    task_id, _ = place(db, 21, extra={"run_at": (db.later("10 minutes"), None)})
    db.commit()
    report["delayed"] = {"order": 21, "task": task_id}

    # Chains: order 30 and 31's tasks are parents; `30-ship` is a child of 30 (parent_id), and
    # `30-31-ship` a child of both (async_task_parent rows, ascending parent ids).
    db.begin()
    p30, _ = place(db, 30)
    db.commit()
    db.begin()
    p31, _ = place(db, 31)
    c1, _ = place(db, 30, biz_id="30-ship", extra={"parent_id": ("?", p30)})
    db.commit()
    db.begin()
    c2, _ = place(db, 31, biz_id="30-31-ship")
    db.run("INSERT INTO async_task_parent (child_id, parent_id) VALUES (?, ?), (?, ?)",
           (c2, p30, c2, p31))
    db.commit()
    report["chains"] = [{"child": c1, "parents": [p30]}, {"child": c2, "parents": [p30, p31]}]
    # A retried request places order 40 again, after another insert on this connection,
    # and links a child under the id its (duplicate) task insert gave.
    db.begin()
    p40, _ = place(db, 40)
    db.commit()
    db.begin()
    place(db, 41)
    again, _ = place(db, 40)
    c3, _ = place(db, 40, biz_id="40-ship", extra={"parent_id": ("?", again)})
    db.commit()
    report["repeated"].append({"order": 40, "created": False, "task": again, "first": p40})
    report["chains"].append({"child": c3, "parents": [p40]})

    # Invalid rows: each in its own transaction with its order; the database must refuse it.
    invalid = [
        ("bad_keyword", {"keyword": "Points Credit!"}),
        ("empty_biz_id", {"biz_id": ""}),
        ("long_biz_id", {"biz_id": "x" * 129}),
        ("not_json", {"biz_data": '{"user_id": 7'}),
        ("too_large", {"biz_data": json.dumps({"pad": "x" * 70000})}),
        ("nul_escape", {"biz_data": '{"note": "a\\u0000b"}'}),
        ("too_far_ahead", {"extra": {"run_at": (db.later("4000 days"), None)}}),
        ("long_tenant", {"extra": {"tenant": ("?", "t" * 129)}}),
        ("zero_max_attempts", {"extra": {"max_attempts": ("?", 0)}}),
        ("missing_parent", {"extra": {"parent_id": ("?", missing_id(db))}}),
    ]
    if backend == "sqlite":
        invalid += [
            ("iso_run_at", {"extra": {"run_at": ("?", "2026-11-24T10:00:00Z")}}),
            ("run_at_without_millis", {"extra": {"run_at": ("?", "2026-11-24 10:00:00")}}),
        ]
    for n, (case, args) in enumerate(invalid):
        order = 100 + n
        db.begin()
        try:
            place(db, order, **args)
        except db.errors as e:
            db.rollback()
            error = str(e).splitlines()[0] if str(e) else repr(e)
            report["refused"].append({"case": case, "order": order, "error": error})
            continue
        db.rollback()
        raise SystemExit(f"{case}: the database accepted an invalid row")

    json.dump(report, sys.stdout)
    print()


if __name__ == "__main__":
    main()
