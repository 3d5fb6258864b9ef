from tensorwire.cli.app import main

main()
