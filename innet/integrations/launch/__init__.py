"""``innet launch``: an unmodified torch script's ranks on the emulated network, started, watched and stopped
(command.py), on this machine or in Mininet hosts (mininet.py)."""
