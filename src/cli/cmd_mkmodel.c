/* placeholder until the mkmodel command lands (replaced in this session) */
#include <stdio.h>
#include "cmd.h"
int kg_cmd_mkmodel(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kgen mkmodel: not built yet\n");
    return 1;
}
