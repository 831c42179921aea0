//! The variables read without clap: by the dev stack, the test harness, the
//! demo's service launcher and the scripts. They have no declaration to
//! generate from, so they are listed here, once; the drift test finds every
//! `env::var` (and the dev stack's `setting`) read in the workspace and
//! every `${NAME:-default}` in `scripts/`, and fails on one not listed here,
//! or listed here and read nowhere.

/// One variable read directly from the environment.
pub struct Direct {
    pub name: &'static str,
    /// Who reads it.
    pub read_by: &'static str,
    /// Its value when unset.
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn d(
    name: &'static str,
    read_by: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Direct {
    Direct {
        name,
        read_by,
        default,
        meaning,
    }
}

/// Every one of them, by who reads it.
pub const ALL: &[Direct] = &[
    d(
        "DATABASE_URL",
        "devstack",
        "the machine's server on 127.0.0.1:5432, else a project-local cluster",
        "Postgres for the stack and every service; set, the dev stack uses it and starts none",
    ),
    d(
        "KAFKA_BROKERS",
        "devstack, gateway-bench",
        "`127.0.0.1:9092`",
        "the broker's bootstrap servers; set, the dev stack starts no broker",
    ),
    d(
        "REDIS_URL",
        "devstack, gateway-lite's tests",
        "`redis://127.0.0.1:6379`",
        "the Redis the gateways share; tests that stop Redis start a private `redis-server`",
    ),
    d(
        "METERLINE_FORCE_LOCAL_PG",
        "devstack",
        "unset",
        "`1`: run a project-local Postgres cluster in `.stack/pg` even when the machine has one",
    ),
    d(
        "METERLINE_LOCAL_PG_PORT",
        "devstack",
        "`55432`",
        "the project-local cluster's port",
    ),
    d(
        "METERLINE_BROKER_PORT",
        "devstack",
        "`9092`",
        "where the dev stack looks for, or starts, the broker",
    ),
    d(
        "METERLINE_TOPIC",
        "devstack",
        "`usage.events.v1`",
        "the topic the dev stack creates",
    ),
    d(
        "METERLINE_PARTITIONS",
        "devstack",
        "`4`",
        "partitions of the topic the dev stack creates",
    ),
    d(
        "METERLINE_CACHE",
        "devstack, the tests, scripts/ensure-tools.sh",
        "`~/.cache/meterline`",
        "where the broker, the S3 server and the validators are built or installed once",
    ),
    d(
        "NISSHI_VERSION",
        "devstack",
        "`0.8.1`",
        "the broker version built into the cache",
    ),
    d(
        "NISSHI_RUST_LOG",
        "devstack",
        "`warn`",
        "the broker's log filter",
    ),
    d(
        "S3S_FS_VERSION",
        "devstack",
        "`0.14.1`",
        "the S3-compatible server version the archive's S3 tests run",
    ),
    d(
        "METERLINE_BIN_DIR",
        "devstack (tests, demo)",
        "the running executable's directory",
        "where the workspace's binaries are, for the tests and the demo that start them",
    ),
    d(
        "METERLINE_KEEP_DATABASES",
        "devstack (tests)",
        "unset",
        "`1`: keep each test's `mt_` database for a post-mortem (`devstack down` drops them)",
    ),
    d(
        "CARGO_TARGET_DIR",
        "the browser tests, the bench scripts",
        "`target`",
        "cargo's output directory, where the binaries are found",
    ),
    d(
        "RUST_LOG",
        "demo (for the services it starts), every binary",
        "`info,rdkafka=warn`",
        "the log filter (`tracing_subscriber::EnvFilter`)",
    ),
    d(
        "UPDATE_OPENAPI",
        "billing-api's tests",
        "unset",
        "set: rewrite `billing-api/openapi.json` from the code instead of comparing",
    ),
    d(
        "DRILL_SEED",
        "the ingest fault drill",
        "random",
        "repeat a drill run (the run prints its seed)",
    ),
    d(
        "DRILL_EVENTS",
        "the ingest fault drill",
        "`20000`",
        "events in a drill run",
    ),
    d(
        "ARCHIVE_SEED",
        "the archive test",
        "random",
        "repeat an archive test run (the run prints its seed)",
    ),
    d(
        "ARCHIVE_EVENTS",
        "the archive test",
        "`5000`",
        "events in an archive test run",
    ),
    d(
        "OPENAPI_MAX_EXAMPLES",
        "the OpenAPI conformance test",
        "`60`",
        "test cases per operation and phase",
    ),
    d(
        "SCHEMATHESIS",
        "the OpenAPI conformance test",
        "the virtualenv ensure-tools.sh makes, else `PATH`",
        "the `st` executable",
    ),
    d(
        "FOCUS_VALIDATOR_VENV",
        "the FOCUS conformance test",
        "the virtualenv ensure-tools.sh makes",
        "the FOCUS validator's virtualenv",
    ),
    d(
        "OPENAI_SDK_PYTHON",
        "the OpenAI SDK tests",
        "the newest `openai-*` virtualenv ensure-tools.sh makes",
        "the python with the `openai` package",
    ),
    d(
        "CI",
        "scripts/test.sh",
        "unset",
        "`true`: a one-shot build, without incremental compilation's cache",
    ),
    d(
        "METERLINE_TEST_THREADS",
        "scripts/test.sh",
        "`4`",
        "tests nextest runs at once",
    ),
    d(
        "N",
        "scripts/bench-archive-idle.sh",
        "`1000000`",
        "requests archived before the idle measurement",
    ),
    d(
        "IDLE_SECS",
        "scripts/bench-archive-idle.sh",
        "`30`",
        "seconds the idle archiver is measured",
    ),
    d(
        "LINGER_MS",
        "scripts/bench-archive-idle.sh",
        "`2000`",
        "the measured archiver's `ARCHIVE_LINGER_MS`",
    ),
];
