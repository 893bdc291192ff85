"""On-demand measurements that write JSON results and print a table (never run by the tests)."""
