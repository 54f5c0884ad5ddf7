"""The forked transport: ranks forked from a per-session fork server, watched over unix sockets and
journal files, judged by the referee. Controller side.

- ``zygote_client``: the client of the fork server (``pytest_nccl/rank/zygote.py``);
- ``group``: one group of rank processes, one call at a time, fed to the referee;
- ``call``: one call on a group, as the driver's transport (``core/call.py``);
- ``timing``: the forked transport's own waits;
- ``pool``: the fork server and the one live group of a pytest process, GPU leases;
- ``gpus``: GPU leases across processes;
- ``mode``: the plugin's forked mode (run an item, ``nccl_world``).
"""
