#!/opt/ct200/venv/bin/python
"""STAND-IN for `ct200-doctor gate NAME --spec PATH`, installed by tests/testbed/test_servers.py
on the testbed's ct machine ONLY while the installed ct200-doctor has no `gate` command (issue 11
deliverable 4 adds it, in parallel with the server units). It replaces <venv>/bin/ct200-doctor and
hands every other command to the real one (ct200_tools.cli.entry, unchanged).

The gate it stands for runs the doctor's checks that apply to one server. This stand-in runs real
doctor checks too, but a fixed choice: for a server with GPUs the device-node and CUDA checks
(`ct200-doctor check --only dev.nodes --only gpu.cuda_init`), which fail on the testbed, that has
no GPU; for a server without GPUs nothing, and says so. It does not check the port.
"""

import sys

from ct200_tools.cli.entry import main

if len(sys.argv) > 2 and sys.argv[1] == "gate":
    from ct200_tools.spec import load_spec

    name = sys.argv[2]
    spec = sys.argv[sys.argv.index("--spec") + 1] if "--spec" in sys.argv else "/etc/ct200/site.yml"
    server = next((s for s in load_spec(spec).servers if s.name == name), None)
    if server is None:
        print(f"ct200-doctor gate {name} (stand-in): no such server in {spec}")
        sys.exit(2)
    if not server.gpus:
        print(f"ct200-doctor gate {name} (stand-in): no GPUs, no GPU checks")
        sys.exit(0)
    print(f"ct200-doctor gate {name} (stand-in): the GPU checks of the doctor:", flush=True)
    sys.argv = ["ct200-doctor", "check", "--spec", spec, "--only", "dev.nodes"]
    sys.argv += ["--only", "gpu.cuda_init"]
main()
