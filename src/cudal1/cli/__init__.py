"""Command-line front end: one module per subcommand; each parses flags, calls one library
function and maps the result to an exit code."""
