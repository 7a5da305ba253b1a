/* A System V shared-memory segment and semaphore set shared by a parent and
 * its child: the child writes a message under the semaphore, the parent
 * reads it back. Prints "sysv shm: <message>" or the failing call. */
#include <stdio.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    int shm = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
    if (shm < 0) { perror("shmget"); return 1; }
    int sem = semget(IPC_PRIVATE, 1, IPC_CREAT | 0600);
    if (sem < 0) { perror("semget"); return 1; }
    char *memory = shmat(shm, NULL, 0);
    if (memory == (void *)-1) { perror("shmat"); return 1; }
    memory[0] = 0;
    pid_t child = fork();
    if (child == 0) {
        strcpy(memory, "written by the child");
        struct sembuf post = {0, 1, 0};
        _exit(semop(sem, &post, 1) == 0 ? 0 : 2);
    }
    struct sembuf wait_for_child = {0, -1, 0};
    if (semop(sem, &wait_for_child, 1) != 0) { perror("semop"); return 1; }
    int status;
    waitpid(child, &status, 0);
    printf("sysv shm: %s\n", memory);
    shmdt(memory);
    shmctl(shm, IPC_RMID, NULL);
    semctl(sem, 0, IPC_RMID);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
