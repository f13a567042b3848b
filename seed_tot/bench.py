"""`seed-tot bench` (placeholder until the benchmark issue lands: see issue 5)."""
import click


@click.command()
def bench():
    """Benchmark the decoding modes on one workload."""
    raise click.UsageError("bench is not built yet")
