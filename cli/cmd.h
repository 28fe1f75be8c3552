/* Subcommands of the `tandem` command; each lives in cli/cmd_<name>.c. */
#ifndef TANDEM_CLI_CMD_H
#define TANDEM_CLI_CMD_H

/* argv[0] is the subcommand name; return the process exit code. */
typedef int (*cmd_fn)(int argc, char **argv);

int cmd_gguf_info(int argc, char **argv);
int cmd_st_info(int argc, char **argv);
int cmd_st_write(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);

int cmd_serve(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_restart(int argc, char **argv);

#endif
