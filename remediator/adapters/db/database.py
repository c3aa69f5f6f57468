"""Engine creation, transactions and error translation for SQLite and Postgres.

SQLite (the embedded default) runs in WAL mode with ``synchronous=FULL`` so a commit is durable;
writers take ``BEGIN IMMEDIATE`` and an in-process lock, so they queue instead of failing with
"database is locked" halfway through a transaction. Postgres (production, several replicas)
uses asyncpg with a small pool for the web pages' and the API's reads, and psycopg2 on a few
threads for transactions of synchronous code (``write_sync``, ``read_sync``: the engine's, the
webhook's); claims there use ``FOR UPDATE SKIP LOCKED``.

Errors leave a transaction translated: a value the database refuses (too long for its column,
out of range) is ``ValidationFailed``, since it would be refused again on every retry; a lost
connection or a timeout is ``StoreUnavailable``, worth retrying; a violated constraint or a
statement the database cannot run propagates unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.ext import asyncio as sa_async

from remediator.domain import errors

logger = logging.getLogger("remediator.db")

T = TypeVar("T")

#: Postgres: a background transaction (retention's batches) starts once no other transaction
#: of this process has been in flight for ``BACKGROUND_QUIET`` seconds, or after it has waited
#: ``BACKGROUND_PATIENCE`` (so that housekeeping goes on, a batch a second, under a storm that
#: never pauses). SQLite grants them its writer only when nobody else waits (``WriteLock``).
BACKGROUND_QUIET = 0.02
BACKGROUND_PATIENCE = 1.0
#: ... and while the process is busy (another transaction in flight, or one ended within
#: ``BACKGROUND_BUSY`` seconds), after a background transaction that took t seconds the next
#: one waits ``BACKGROUND_PAUSE`` times t first: housekeeping takes at most a fifth of the
#: time a busy process has.
BACKGROUND_BUSY = 1.0
BACKGROUND_PAUSE = 4.0


def normalise_url(url: str) -> str:
    """Accept ``sqlite:///x.db`` and ``postgresql://`` and pick the async drivers."""
    if url.startswith("sqlite:"):
        return "sqlite+aiosqlite:" + url[len("sqlite:") :]
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    return url


# asyncpg's URL options that libpq (psycopg2) names otherwise or does not know.
_ASYNCPG_ONLY = frozenset(
    {"prepared_statement_cache_size", "prepared_statement_name_func", "command_timeout"}
)


def libpq_url(url: str) -> sa.URL:
    """The Postgres URL for psycopg2: asyncpg's ``ssl=`` is libpq's ``sslmode=`` (``true``
    meaning ``require``), and options only asyncpg knows are left out."""
    parsed = sa.engine.make_url(url)
    query = {k: v for k, v in parsed.query.items() if k not in _ASYNCPG_ONLY}
    ssl = query.pop("ssl", None)
    if ssl is not None and "sslmode" not in query:
        text = ssl if isinstance(ssl, str) else ssl[-1]
        query["sslmode"] = "require" if text.lower() in ("true", "1", "yes") else text
    return parsed.set(drivername="postgresql+psycopg2", query=query)


class WriteLock:
    """SQLite's single writer, shared fairly but with the webhook first.

    Waiters marked ``urgent`` (intake commits, which Alertmanager is waiting on) are granted
    the lock before any waiting engine transaction, and ``background`` ones (retention's
    batches) only when nobody else waits; among equals it is first come, first served.
    Holding it never spans more than one transaction.
    """

    def __init__(self) -> None:
        self._held = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = 0
        # Read by the holder's thread to cut a batch short; a plain int, changed on the loop.
        self.urgent_waiting = 0

    @contextlib.asynccontextmanager
    async def hold(self, *, urgent: bool = False, background: bool = False) -> AsyncIterator[None]:
        await self._acquire(0 if urgent else 2 if background else 1)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if not self._held and not self._waiting:
            self._held = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._waiting, (priority, self._seq, future))
        urgent = priority == 0
        self.urgent_waiting += urgent
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # granted just as we were cancelled: pass it on
            else:
                self._waiting = [w for w in self._waiting if w[2] is not future]
                heapq.heapify(self._waiting)
            raise
        finally:
            self.urgent_waiting -= urgent

    def _release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # ownership passes straight to the next waiter
                return
        self._held = False


class Database:
    def __init__(
        self, url: str, *, echo: bool = False, pool_size: int = 10, timeout: float = 30.0
    ) -> None:
        self.url = normalise_url(url)
        self.dialect = sa.engine.make_url(self.url).get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "postgresql":
            kwargs |= {
                "pool_size": pool_size,
                "max_overflow": pool_size,
                "pool_pre_ping": True,
                "connect_args": {"timeout": timeout, "command_timeout": timeout},
            }
        else:
            kwargs |= {"connect_args": {"timeout": timeout}}
        self.timeout = timeout
        self.engine = sa_async.create_async_engine(self.url, **kwargs)
        self._write_lock = WriteLock() if self.is_sqlite else None
        self._sync_engine: sa.Engine | None = None
        self._writer_conn: sa.Connection | None = None
        # One thread for SQLite writes: the writes are serialised anyway, and one thread keeps
        # its connection (and the CPU's caches) instead of handing them between pool threads.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sqlite-w")
        if self.is_sqlite:
            self._configure_sqlite(self.engine.sync_engine)
        # Postgres transactions of synchronous code (the engine's, the webhook's) run on
        # threads of their own over psycopg2: through asyncpg each of their statements waited
        # for a turn of a busy event loop (1.5 ms a statement during an alert storm, 30 of them
        # an alert), on a thread a statement waits for the database only. (psycopg 3 did the
        # same work with 10-20 % more CPU: it builds each result's description in Python.)
        self._pg_sync: sa.Engine | None = None
        self._pg_threads: concurrent.futures.ThreadPoolExecutor | None = None
        if self.is_postgres:
            self._pg_sync = sa.create_engine(
                libpq_url(self.url),
                pool_size=pool_size,
                max_overflow=0,
                pool_pre_ping=True,
                connect_args={
                    "connect_timeout": max(2, round(timeout)),
                    # No JIT: these transactions' statements read a few rows each, and a
                    # page of retention's (estimated over the whole history) spent most of
                    # its 50 ms compiling 25 functions for a 200-row answer.
                    "options": f"-c statement_timeout={int(timeout * 1000)} -c jit=off",
                },
            )
            self._pg_threads = concurrent.futures.ThreadPoolExecutor(
                pool_size, thread_name_prefix="pg"
            )
        self.latency_observer: Any = None
        self.background_patience = BACKGROUND_PATIENCE
        self._in_flight = 0  # Postgres: transactions of this process under way, but background
        self._quiet_since = float("-inf")  # (loop time) when the last of them ended
        self._background_after = float("-inf")  # (loop time) the next background one's turn

    def writers_waiting(self) -> bool:
        """Whether an urgent writer (the webhook) waits for the current write transaction."""
        return self._write_lock is not None and self._write_lock.urgent_waiting > 0

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    def _configure_sqlite(self, sync_engine: sa.Engine) -> None:
        @event.listens_for(sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            for pragma in (
                "journal_mode=WAL",
                "synchronous=FULL",
                "foreign_keys=ON",
                f"busy_timeout={int(self.timeout * 1000)}",
            ):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        @event.listens_for(sync_engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            immediate = conn.get_execution_options().get("sqlite_immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    @contextlib.asynccontextmanager
    async def write(self, operation: str = "write") -> AsyncIterator[sa_async.AsyncConnection]:
        """A write transaction: committed on success, rolled back on error."""
        lock = self._write_lock.hold() if self._write_lock else contextlib.nullcontext()
        started = time.perf_counter()
        async with lock, self._translated():
            conn = await self.engine.connect()
            try:
                if self.is_sqlite:
                    conn = await conn.execution_options(sqlite_immediate=True)
                async with conn.begin():
                    yield conn
            finally:
                await conn.close()
        self._observe(operation, started)

    async def write_sync(
        self,
        operation: str,
        work: Callable[[sa.Connection], T],
        *,
        urgent: bool = False,
        background: bool = False,
    ) -> T:
        """Run ``work`` in one write transaction, as a single call into the database.

        On SQLite that call is one hop to a worker thread with a plain sqlite3 connection
        (aiosqlite would hop once per cursor operation, a dozen times per transaction); on
        Postgres one hop to a thread of a small pool, over psycopg2. ``urgent``: the webhook
        waits for it (granted SQLite's writer first); ``background``: housekeeping, granted
        SQLite's writer only when no one else waits for it, and on Postgres started in a quiet
        moment of the process and paced while it is busy (``_give_way``).
        """
        started = time.perf_counter()
        if not self.is_sqlite:
            if background:
                await self._give_way()
                return await self._on_pg_thread(operation, work, started, background=True)
            return await self._on_pg_thread(operation, work, started)
        assert self._write_lock is not None
        hold = self._write_lock.hold(urgent=urgent, background=background)
        async with hold, self._translated():
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._writer, self._run_sync_sqlite, work)
        self._observe(operation, started)
        return result

    async def read_sync(self, operation: str, work: Callable[[sa.Connection], T]) -> T:
        """Run ``work`` in one transaction that writes nothing: on SQLite on the writer's
        thread (as ``write_sync``), on Postgres on a thread of its own."""
        if self.is_sqlite:
            return await self.write_sync(operation, work)
        return await self._on_pg_thread(operation, work, time.perf_counter())

    async def _give_way(self) -> None:
        """Postgres: wait for a quiet moment before a background transaction (at most
        ``background_patience``). Retention's first pass over a long history (10⁶ expired
        episodes reduced, 3.5 minutes of back-to-back batches) ran through every storm
        meanwhile, on Postgres's CPU and this process's."""
        loop = asyncio.get_running_loop()
        if self._in_flight or loop.time() - self._quiet_since < BACKGROUND_BUSY:
            await asyncio.sleep(max(0.0, self._background_after - loop.time()))
        deadline = loop.time() + self.background_patience
        # (polled: a quiet moment is the absence of events, which nothing can signal)
        while loop.time() < deadline and (  # noqa: ASYNC110
            self._in_flight or loop.time() - self._quiet_since < BACKGROUND_QUIET
        ):
            await asyncio.sleep(BACKGROUND_QUIET)

    async def _on_pg_thread(
        self,
        operation: str,
        work: Callable[[sa.Connection], T],
        started: float,
        *,
        background: bool = False,
    ) -> T:
        assert self._pg_sync is not None
        assert self._pg_threads is not None
        engine = self._pg_sync

        def in_transaction() -> T:
            with engine.begin() as conn:
                return work(conn)

        loop = asyncio.get_running_loop()
        began = loop.time()
        if not background:
            self._in_flight += 1
        try:
            async with self._translated():
                result = await loop.run_in_executor(self._pg_threads, in_transaction)
        finally:
            if not background:
                self._in_flight -= 1
                self._quiet_since = loop.time()
            else:
                self._background_after = loop.time() + BACKGROUND_PAUSE * (loop.time() - began)
        self._observe(operation, started)
        return result

    def _run_sync_sqlite(self, work: Callable[[sa.Connection], T]) -> T:
        # Runs on the writer thread only, which keeps one connection open for good: checking a
        # connection out of a pool and back (with its reset) cost as much as a small intake
        # transaction.
        if self._writer_conn is None:
            if self._sync_engine is None:
                url = sa.engine.make_url(self.url).set(drivername="sqlite+pysqlite")
                self._sync_engine = sa.create_engine(
                    url,
                    connect_args={"timeout": self.timeout, "check_same_thread": False},
                    poolclass=sa.pool.NullPool,
                )
                self._configure_sqlite(self._sync_engine)
            connection = self._sync_engine.connect()
            self._writer_conn = connection.execution_options(sqlite_immediate=True)
        conn = self._writer_conn
        try:
            with conn.begin():
                return work(conn)
        except exc.DBAPIError:
            if conn.invalidated or conn.closed:  # start the next transaction afresh
                self._close_writer_conn()
            raise

    def _close_writer_conn(self) -> None:
        if self._writer_conn is not None:
            with contextlib.suppress(Exception):
                self._writer_conn.close()
            self._writer_conn = None

    @contextlib.asynccontextmanager
    async def read(self, operation: str = "read") -> AsyncIterator[sa_async.AsyncConnection]:
        started = time.perf_counter()
        async with self._translated(), self.engine.connect() as conn, conn.begin():
            yield conn
        self._observe(operation, started)

    def _observe(self, operation: str, started: float) -> None:
        if self.latency_observer is not None:
            self.latency_observer(operation, time.perf_counter() - started)

    @contextlib.asynccontextmanager
    async def _translated(self) -> AsyncIterator[None]:
        try:
            yield
        except exc.DBAPIError as e:
            refused = refused_value(e)
            if refused is not None:  # the same value is refused on every retry: not a 503
                raise errors.ValidationFailed(f"the database refuses a value: {refused}") from e
            if isinstance(e, (exc.IntegrityError, exc.ProgrammingError, exc.NotSupportedError)):
                raise  # our bug or a constraint doing its job: never "try again later"
            raise errors.StoreUnavailable(f"database unavailable: {_short(e)}") from e
        except (OSError, TimeoutError) as e:
            raise errors.StoreUnavailable(f"database unavailable: {_short(e)}") from e

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the database takes a write."""
        async with self.write("ping") as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()
        if self._pg_sync is not None:
            self._pg_sync.dispose()
        if self._pg_threads is not None:
            self._pg_threads.shutdown(wait=False)
        if self._writer_conn is not None:
            # On the writer thread, after whatever transaction it is running.
            with contextlib.suppress(RuntimeError):  # the writer was already shut down
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._writer, self._close_writer_conn)
        if self._sync_engine is not None:
            self._sync_engine.dispose()
        self._writer.shutdown(wait=False)


def refused_value(error: BaseException | None) -> str | None:
    """What the database said if it refuses the data itself, else None.

    That is SQLSTATE class 22 (data exception: a string longer than its column, a number out
    of range, a character the encoding cannot hold). asyncpg's errors reach us as a plain
    ``DBAPIError`` whatever their class, so the SQLSTATE decides, not the exception type.
    """
    if not isinstance(error, exc.DBAPIError):
        return None
    code = getattr(error.orig, "sqlstate", None) or getattr(error.orig, "pgcode", None)
    if isinstance(error, exc.DataError) or (isinstance(code, str) and code.startswith("22")):
        return _short(error)
    return None


def _short(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.splitlines()[0][:200] if text else type(error).__name__
