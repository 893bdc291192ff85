from gpuweave.cli import main

raise SystemExit(main())
