import os, sys
print(f"python rank={os.environ['RANK']} args={sys.argv[1:]} unbuffered={sys.stdout.write_through}")
