from sparkserve.cli import main

main()
