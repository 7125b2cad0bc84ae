"""The run store's tables (:mod:`cudal1.store`): the SQL that creates them, and the schema version
a store file carries in ``meta``.  A change to a table is a new version (no migrations exist yet)."""

SCHEMA_VERSION = 1

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS tasks (
        hash TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        task_id TEXT NOT NULL,
        level INTEGER,
        problem_id INTEGER,
        source TEXT NOT NULL,
        origin TEXT NOT NULL DEFAULT '',
        added_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS candidates (
        hash TEXT NOT NULL,
        task_hash TEXT NOT NULL,
        source TEXT NOT NULL,
        label TEXT NOT NULL DEFAULT '',
        meta_json TEXT NOT NULL DEFAULT '{}',
        added_at REAL NOT NULL,
        PRIMARY KEY (hash, task_hash)
    )""",
    "CREATE INDEX IF NOT EXISTS candidates_task ON candidates (task_hash)",
    """CREATE TABLE IF NOT EXISTS evaluations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        task_hash TEXT NOT NULL,
        candidate_hash TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        status TEXT NOT NULL,
        speedup REAL,
        result_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (task_hash, candidate_hash, config_hash)
    )""",
    "CREATE INDEX IF NOT EXISTS evaluations_task_status ON evaluations (task_hash, status)",
    """CREATE TABLE IF NOT EXISTS baselines (
        task_hash TEXT NOT NULL,
        mode TEXT NOT NULL,
        env_key TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        result_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (task_hash, mode, env_key, config_hash)
    )""",
    """CREATE TABLE IF NOT EXISTS environments (
        key TEXT PRIMARY KEY,
        json TEXT NOT NULL
    )""",
    # Optimizer responses, usable or not: a response without code is a format failure, kept.
    """CREATE TABLE IF NOT EXISTS responses (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        task_hash TEXT NOT NULL,
        round INTEGER NOT NULL,
        policy TEXT NOT NULL,
        prompt_json TEXT NOT NULL,
        response TEXT NOT NULL,
        analysis TEXT NOT NULL,
        candidate_hash TEXT,
        problem TEXT NOT NULL,
        error TEXT NOT NULL,
        usage_json TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE INDEX IF NOT EXISTS responses_task ON responses (task_hash, round)""",
    """CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        config_json TEXT NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        status TEXT NOT NULL
    )""",
)
