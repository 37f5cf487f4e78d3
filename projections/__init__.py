"""Read models folded from the events topic: PostgreSQL metadata and the graph DAG."""
