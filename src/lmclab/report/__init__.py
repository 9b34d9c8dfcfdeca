"""Tables, headline metrics, figures and the report of a run, and the metric gate."""
