"""The SQL store (SQLAlchemy Core on aiosqlite, or on asyncpg and psycopg2)."""
