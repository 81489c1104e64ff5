from nvmon.cli import main

main()
