from taskstream.cli import main

main()
