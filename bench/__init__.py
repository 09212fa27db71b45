"""ddpbench's suite: config → matrix → launch → worker → results → report (see docs/design.md)."""
