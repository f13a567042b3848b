"""Built-in ToT tasks, written only against the public `seed_tot.search.protocol.Task` protocol."""
