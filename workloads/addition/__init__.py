"""Demo workload: a tiny transformer learns integer addition written as text ("17+25=" -> "42")."""
