# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_relaybus_global_optspecs
    string join \n database-url= schema= prefix= json no-prepared-statements lock-timeout= h/help V/version
end

function __fish_relaybus_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_relaybus_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_relaybus_using_subcommand
    set -l cmd (__fish_relaybus_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c relaybus -n "__fish_relaybus_needs_command" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_needs_command" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_needs_command" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_needs_command" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_needs_command" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_needs_command" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_needs_command" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "setup" -d 'Install the store, or bring it to the current schema in place'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "upgrade" -d 'Convert a 0.1 store to 0.2 in place.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "top" -d 'Watch handlers, workers and lanes live; pause, resume and requeue.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "completions" -d 'Print a shell completion script.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "schema-sql" -d 'Print the schema as SQL for your own migration tool (Flyway, Atlas, a DBA).'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "publish" -d 'Publish events: one from flags, or many as NDJSON on standard input.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "run" -d 'Run a worker: claim deliveries and hand them to shell commands, webhooks or SQL.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "deliveries" -d 'List and inspect deliveries'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "events" -d 'List, inspect and replay events'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "dead" -d 'List and requeue dead deliveries (those buried after their last attempt, exit 65 or HTTP 410)'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "purge" -d 'Delete what retention allows, in bounded batches.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "lanes" -d 'Show the 256 lanes: owner, epoch, lease, in flight, pending, oldest due'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "workers" -d 'Every worker that holds lanes: host, process, lanes, in flight, lease end.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "stats" -d 'Per handler: its state (running, paused, or its circuit breaker open), due, scheduled, processing, dead, completed and the lag (age of the oldest due delivery)'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "handlers" -d 'Pause and resume handlers in every worker of the store, and see their state.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "doctor" -d 'Check the store\'s schema and health, and say what to do about each finding.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "bench" -d 'Measure publish and dispatch throughput, mixed-load latency and the database\'s counters.'
complete -c relaybus -n "__fish_relaybus_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l check -d 'Only check the installed version; change nothing'
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand setup" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l quiet-for -d 'With --contract: how long no 0.1 publisher may have written' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l dry-run -d 'Print the plan and stop; write nothing'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l show-sql -d 'With --dry-run, also print the conversion as the script `schema-sql --from 0.1` renders (SQL, or mongosh on MongoDB)'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -s y -l yes -d 'Do not ask for confirmation'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l force -d 'Convert even while 0.1 deliveries hold unexpired leases (their workers must be stopped)'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l online -d 'Convert while the application reads and writes: rows are filled in batches of 5,000, indexes built concurrently, and the tables are locked only for catalog changes, at the start and for a fraction of a second at the end. Killed anywhere, run it again. 0.1 publishers may publish until the end. MongoDB conversions are always online'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l contract -d 'End the expansion an online conversion leaves: drop what only 0.1 publishers needed, so that the store is exactly a fresh 0.2 install. Refuses, writing nothing, while a 0.1 publisher wrote within --quiet-for; --force contracts anyway (a 0.1 publisher\'s next write then fails). Locks for milliseconds, waiting at most 500 ms at a time'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand upgrade" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l interval -d 'How often the store is read' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l once -d 'Print one snapshot and exit'
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand top" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand completions" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l from -d 'Render the conversion from this installed version instead of a fresh install' -r -f -a "0.1\t''"
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l grants -d 'Render the grants a runtime role needs instead' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand schema-sql" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l type -d 'Event type (publishes one event from flags)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l key -d 'Ordering key: deliveries of one key are handled in publish order, per handler' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l id -d 'Event id (generated when absent: a ULID). Publishing an existing id is idempotent' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l handler -d 'Handler that gets a delivery of the event (repeatable)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l header -d 'Header `k=v` (repeatable)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l data -d 'Payload as JSON, or @FILE to read it from a file' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l batch-size -d 'Events per transaction when reading stdin' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l max-payload-bytes -d 'Largest payload accepted, in bytes' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand publish" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l handler -d 'Handler name (with --exec, --webhook, --sql or --noop)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l exec -d 'Shell command run with `sh -c` for each delivery' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l webhook -d 'URL that gets a POST of each delivery' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l sql -d 'SQL statement run on the store\'s PostgreSQL database in the transaction that completes each delivery, so its effect exists exactly once per delivery. Parameters: $1 event id, $2 payload (jsonb), $3 key, $4 type, $5 headers (jsonb), $6 delivery id, $7 attempt' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l config -d 'TOML file with one table per handler, for several handlers in one process' -r -F
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l concurrency -d 'Deliveries handled at once' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l batch-size -d 'Deliveries claimed per claim at most' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l poll-interval -d 'How often an idle worker looks for due work (wake-ups usually come sooner)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l lease-duration -d 'How long a lane lease lasts without renewal; a crashed worker\'s work waits this long' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l pool-size -d 'Database connections' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l max-attempts -d 'Attempts before a delivery is buried' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l retry-delay -d 'Base of the exponential backoff between attempts' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l retry-max-delay -d 'Longest wait between attempts (also caps Retry-After)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l timeout -d 'Time one attempt may take' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l webhook-secret -d 'Standard Webhooks signing secret (`whsec_...`) for webhook handlers' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l completion-window -d 'Completions finishing within this window are deleted by one statement' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l shutdown-grace -d 'How long running handlers may finish after a stop signal' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l stall-after -d 'A claim, lease renewal or recording of an outcome that waits this long is reported stalled: logged with the database sessions blocking it, counted in relaybus_stalls_total, and /readyz unready until it goes through' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l breaker-threshold -d 'A webhook endpoint that fails (5xx, timeout, refused connection) this many times in a row opens its circuit breaker, shared by every worker of the store: nothing is sent to it for 30 s (doubling after each failed probe, up to --breaker-max-cooldown), then one probe; its deliveries wait meanwhile without an attempt charged. The worker writes its breaker settings (these flags, or a handler\'s `breaker_threshold` and `breaker_max_cooldown` in --config) to the handler\'s row when it starts, and every worker counts against the row\'s: the last started worker\'s settings hold' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l breaker-max-cooldown -d 'The longest an open circuit breaker waits before its next probe (a shorter one finds a flapping endpoint up sooner, at the price of more probes)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l wake-up -d 'How an idle worker learns of new work: LISTEN/NOTIFY plus polling, or polling only (for poolers that cannot LISTEN)' -r -f -a "listen\t''
poll\t''"
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l metrics-addr -d 'Serve Prometheus metrics at /metrics, and /healthz and /readyz, on this address (for example 127.0.0.1:9464)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l log-format -d 'Log lines as text or JSON, on stderr. On a terminal, text lines print above a live status line (handled, failed, dead, in flight, the rate of the last 10 s)' -r -f -a "text\t''
json\t''"
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l noop -d 'Complete each delivery without running anything (benchmarks, or discarding a handler\'s backlog on purpose)'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l drain -d 'Exit 0 once no due work is left (batch jobs, tests). Deliveries whose next attempt is due later are not waited for; the summary counts them'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l completion-history -d 'Keep an append-only history of completions (one insert per completion)'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -s v -l verbose -d 'More log detail: -v relaybus\'s debug events, -vv everything\'s. RELAYBUS_LOG, a tracing filter (`warn`, `relaybus=debug`), overrides it'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand run" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -f -a "list" -d 'List deliveries in creation order (completed ones newest first).'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -f -a "show" -d 'Show one delivery: its state, attempts, last error, lane and lease'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and not __fish_seen_subcommand_from list show help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l status -d 'Only deliveries in this state' -r -f -a "pending\t''
processing\t''
dead\t''
completed\t''"
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l handler -d 'Only deliveries of this handler' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l key -d 'Ordering key' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l event -d 'Event id' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l type -d 'Event type' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l limit -d 'At most this many; when there are more, stderr says how to see the next page' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l after -d 'The next page: deliveries created after this one (the last id of the previous page; `next_after` in JSON)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l wide -d 'Whole ids and every column, however wide the terminal'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from show" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from help" -f -a "list" -d 'List deliveries in creation order (completed ones newest first).'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from help" -f -a "show" -d 'Show one delivery: its state, attempts, last error, lane and lease'
complete -c relaybus -n "__fish_relaybus_using_subcommand deliveries; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -f -a "list" -d 'List events in publish order: what `events replay` takes with the same filters.'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -f -a "show" -d 'Show one event: its payload, every handler it ever had, and its remaining deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -f -a "replay" -d 'Give a handler a delivery of each selected event, from history, once.'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and not __fish_seen_subcommand_from list show replay help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l type -d 'Only events of this type; `*` stands for any text (`order.*`). Repeat for several' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l key -d 'Only events of this ordering key' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l since -d 'From here on, inclusive: a time in UTC (`2026-12-01`, `2026-12-01 08:00:00`, RFC 3339), an age (`36h`: that long ago), or an event id' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l until -d 'Up to here, inclusive: a time, an age or an event id, as --since' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l event -d 'Only this event. Repeat for several' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l after -d 'Only events after this one: the next page of a listing (`next_after` in JSON), or where an interrupted replay stopped' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l handler -d 'Only events published for this handler' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l limit -d 'At most this many; when there are more, stderr says how to see the next page' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l wide -d 'Whole ids, however wide the terminal'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from show" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l handler -d 'The handler that gets the deliveries, as workers name it' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l type -d 'Only events of this type; `*` stands for any text (`order.*`). Repeat for several' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l key -d 'Only events of this ordering key' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l since -d 'From here on, inclusive: a time in UTC (`2026-12-01`, `2026-12-01 08:00:00`, RFC 3339), an age (`36h`: that long ago), or an event id' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l until -d 'Up to here, inclusive: a time, an age or an event id, as --since' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l event -d 'Only this event. Repeat for several' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l after -d 'Only events after this one: the next page of a listing (`next_after` in JSON), or where an interrupted replay stopped' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l batch-size -d 'Events per transaction: each batch holds its events\' and keys\' row locks until it commits' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l again -d 'Also replay events whose delivery for the handler completed: for a handler that was wrong. Run again after an interruption, continue with --after the event it names'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l new -d 'A handler the store has not seen yet (no event, delivery or row of the handlers table names it), on purpose. Without it, an unknown name is refused as a typo'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l dry-run -d 'Only count: by type, the first and the last event, what is skipped and why, the lanes touched. Nothing is written'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -s y -l yes -d 'Do not ask for confirmation'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from replay" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from help" -f -a "list" -d 'List events in publish order: what `events replay` takes with the same filters.'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from help" -f -a "show" -d 'Show one event: its payload, every handler it ever had, and its remaining deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from help" -f -a "replay" -d 'Give a handler a delivery of each selected event, from history, once.'
complete -c relaybus -n "__fish_relaybus_using_subcommand events; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -f -a "list" -d 'List dead deliveries with their last error'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -f -a "requeue" -d 'Give dead deliveries a fresh attempt budget, due now.'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and not __fish_seen_subcommand_from list requeue help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l handler -d 'Only this handler\'s' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l limit -d 'At most this many; when there are more, stderr says how to see the next page' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l after -d 'The next page: deliveries created after this one (the last id of the previous page; `next_after` in JSON)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l wide -d 'Whole ids and every column, however wide the terminal'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l id -d 'Delivery id (repeatable)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l handler -d 'Handler of the dead deliveries' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l type -d 'Event type' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l error-contains -d 'Text the last error contains' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l all -d 'Every dead delivery'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l dry-run -d 'Only count what would be requeued'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -s y -l yes -d 'Do not ask for confirmation'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from requeue" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from help" -f -a "list" -d 'List dead deliveries with their last error'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from help" -f -a "requeue" -d 'Give dead deliveries a fresh attempt budget, due now.'
complete -c relaybus -n "__fish_relaybus_using_subcommand dead; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l completed-older-than -d 'Completed rows kept from 0.1, completion history, and events without deliveries, older than this (7d, 12h)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l dead-older-than -d 'Dead deliveries last updated longer ago than this (30d)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l batch-size -d 'Rows per statement' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l dry-run -d 'Only count what would be deleted'
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -s y -l yes -d 'Do not ask for confirmation'
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand purge" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l all -d 'Show every lane'
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand lanes" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand workers" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand stats" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -f -a "list" -d 'Every handler with deliveries or a row: paused since, by whom and why, due, dead, lag, and its circuit breaker'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -f -a "pause" -d 'Stop every worker of the store from claiming a handler\'s deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -f -a "resume" -d 'Let workers claim a paused handler\'s deliveries again'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -f -a "close-breaker" -d 'Close a webhook handler\'s open circuit breaker now, without waiting for its probe: for an endpoint known to be back'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -f -a "forget" -d 'Remove a handler\'s row (its pause, its breaker) once it has no delivery left, so that `handlers list` and `stats` stop showing it'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and not __fish_seen_subcommand_from list pause resume close-breaker forget help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l reason -d 'Why, for whoever looks next (`handlers list`, the workers\' logs)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l by -d 'Who pauses it [default: $USER@host]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l new -d 'Pause a handler the store has not seen yet (no event names it), on purpose: its first deliveries then wait. Without it, an unknown name is refused as a typo'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from pause" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from resume" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from close-breaker" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -s h -l help -d 'Print help'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from forget" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from help" -f -a "list" -d 'Every handler with deliveries or a row: paused since, by whom and why, due, dead, lag, and its circuit breaker'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from help" -f -a "pause" -d 'Stop every worker of the store from claiming a handler\'s deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from help" -f -a "resume" -d 'Let workers claim a paused handler\'s deliveries again'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from help" -f -a "close-breaker" -d 'Close a webhook handler\'s open circuit breaker now, without waiting for its probe: for an endpoint known to be back'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from help" -f -a "forget" -d 'Remove a handler\'s row (its pause, its breaker) once it has no delivery left, so that `handlers list` and `stats` stop showing it'
complete -c relaybus -n "__fish_relaybus_using_subcommand handlers; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l fix-sql -d 'Print only the statements that repair the drift found (SQL, or mongosh on MongoDB)'
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l cell -d 'Only these cells (repeatable); see --list' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l samples -d 'Samples per cell (and per binary with --compare)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l warmup -d 'Work before the window starts, not counted' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l window -d 'The measured window. The default keeps the quick set to a few minutes; the seed\'s method is --warmup 3s --window 15s' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l compare -d 'A second relaybus binary to compare with, interleaved sample by sample' -r -F
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l out -d 'Directory for report.md, samples.jsonl and env.json' -r -F
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l sample-limit -d 'The longest one sample (and one floor run) may take, from creating its store to its checks: on a server too slow for a cell, the sample is reported as beyond it and the bench goes on' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l backlog -d 'Events preloaded for each dispatch and floor sample (default: more than the cell\'s configuration can take in the warm-up and window, at least 10,000). A backlog that runs out inside the window is doubled and the sample measured again' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l schema -d 'Schema that holds the relaybus tables [default: public]. On MongoDB, the database that holds the collections [default: the URL\'s database, else relaybus]' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l lock-timeout -d 'How long a schema change waits for a lock before it fails, names the blocking session and changes nothing' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l database-url -d 'Database URL: postgres://user:password@host:port/db (or libpq\'s key=value pairs), or mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) with libpq\'s defaults' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l prefix -d 'Prefix of every relaybus table, index and function name (of every collection on MongoDB)' -r
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l list -d 'List the cells and exit'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l no-floor -d 'Skip the raw-SQL floor runs'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -s y -l yes -d 'Run even when the server holds relaybus stores with deliveries in them'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l json -d 'Print results as JSON for scripts (stable field names)'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -l no-prepared-statements -d 'Send every statement unnamed, as relaybus does on its own when it finds a transaction pooler (PgBouncer in transaction mode) between it and the server'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c relaybus -n "__fish_relaybus_using_subcommand bench" -s V -l version -d 'Print version'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "setup" -d 'Install the store, or bring it to the current schema in place'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "upgrade" -d 'Convert a 0.1 store to 0.2 in place.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "top" -d 'Watch handlers, workers and lanes live; pause, resume and requeue.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "completions" -d 'Print a shell completion script.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "schema-sql" -d 'Print the schema as SQL for your own migration tool (Flyway, Atlas, a DBA).'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "publish" -d 'Publish events: one from flags, or many as NDJSON on standard input.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "run" -d 'Run a worker: claim deliveries and hand them to shell commands, webhooks or SQL.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "deliveries" -d 'List and inspect deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "events" -d 'List, inspect and replay events'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "dead" -d 'List and requeue dead deliveries (those buried after their last attempt, exit 65 or HTTP 410)'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "purge" -d 'Delete what retention allows, in bounded batches.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "lanes" -d 'Show the 256 lanes: owner, epoch, lease, in flight, pending, oldest due'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "workers" -d 'Every worker that holds lanes: host, process, lanes, in flight, lease end.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "stats" -d 'Per handler: its state (running, paused, or its circuit breaker open), due, scheduled, processing, dead, completed and the lag (age of the oldest due delivery)'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "handlers" -d 'Pause and resume handlers in every worker of the store, and see their state.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "doctor" -d 'Check the store\'s schema and health, and say what to do about each finding.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "bench" -d 'Measure publish and dispatch throughput, mixed-load latency and the database\'s counters.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and not __fish_seen_subcommand_from setup upgrade top completions schema-sql publish run deliveries events dead purge lanes workers stats handlers doctor bench help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from deliveries" -f -a "list" -d 'List deliveries in creation order (completed ones newest first).'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from deliveries" -f -a "show" -d 'Show one delivery: its state, attempts, last error, lane and lease'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from events" -f -a "list" -d 'List events in publish order: what `events replay` takes with the same filters.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from events" -f -a "show" -d 'Show one event: its payload, every handler it ever had, and its remaining deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from events" -f -a "replay" -d 'Give a handler a delivery of each selected event, from history, once.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from dead" -f -a "list" -d 'List dead deliveries with their last error'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from dead" -f -a "requeue" -d 'Give dead deliveries a fresh attempt budget, due now.'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from handlers" -f -a "list" -d 'Every handler with deliveries or a row: paused since, by whom and why, due, dead, lag, and its circuit breaker'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from handlers" -f -a "pause" -d 'Stop every worker of the store from claiming a handler\'s deliveries'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from handlers" -f -a "resume" -d 'Let workers claim a paused handler\'s deliveries again'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from handlers" -f -a "close-breaker" -d 'Close a webhook handler\'s open circuit breaker now, without waiting for its probe: for an endpoint known to be back'
complete -c relaybus -n "__fish_relaybus_using_subcommand help; and __fish_seen_subcommand_from handlers" -f -a "forget" -d 'Remove a handler\'s row (its pause, its breaker) once it has no delivery left, so that `handlers list` and `stats` stop showing it'
