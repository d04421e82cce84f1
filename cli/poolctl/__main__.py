from poolctl.app import main

main()
