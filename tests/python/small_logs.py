"""Small RMM-format allocation logs the command-line tests replay."""

#: The header of an RMM-format log.
HEADER = "Thread,Time,Action,Pointer,Size,Stream"

#: Peak 9 MiB in use, on one stream: three allocations, two live at once at most.
NINE_MIB_PEAK = f"""{HEADER}
1,t,allocate,0x1000,1048576,0
1,t,allocate,0x2000,3145728,0
1,t,free,0x1000,1048576,0
1,t,allocate,0x3000,5242880,0
1,t,free,0x2000,3145728,0
1,t,free,0x3000,5242880,0
"""
