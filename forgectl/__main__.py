from forgectl.cli import main

main()
