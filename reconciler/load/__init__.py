"""Loading: spec files from the working tree or a git revision, YAML with source positions, typed
documents checked into a SpecSet (every problem a Diagnostic with file:line:column), the Environment
a command works in, and the endpoints it serves."""
