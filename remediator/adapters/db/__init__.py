"""The SQL store (SQLAlchemy Core on aiosqlite or asyncpg)."""
